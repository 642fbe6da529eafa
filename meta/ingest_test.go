package meta

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// typedFields is a schema with a field of every type.
var typedFields = []fieldRecord{{Name: "pk", Type: "int64"}, {Name: "small", Type: "int8"}, {Name: "ok", Type: "bool"},
	{Name: "score", Type: "float"}, {Name: "exact", Type: "double"}, {Name: "name", Type: "varchar"}, {Name: "meta", Type: "json"},
	{Name: "emb", Type: "float_vector"}, {Name: "bits", Type: "binary_vector"}}

const typedJSONRow = `{"pk": 1, "small": -8, "ok": true, "score": 0.5, "exact": 1e300, "name": "a", "meta": {"k": [1]}, "emb": [1, 2.5], "bits": [0, 255]}`

const typedCSVHeader = "pk,small,ok,score,exact,name,meta,emb,bits\n"

const typedCSVRow = `1,-8,true,0.5,1e300,"a, b","{""k"": [1]}","[1, 2.5]","[0, 255]"` + "\n"

// readImportFile reads name under root as the importer does.
func readImportFile(t *testing.T, root, name string, fields []fieldRecord) (uint64, error) {
	t.Helper()
	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	f, err := openImport(r, root, name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fr := &fileReader{ctx: context.Background(), name: name, chk: newRowChecker(fields)}
	return fr.read(f)
}

// TestR10_3_ImportFileFormats: JSON lines and CSV files are read row by row,
// each row validated against the collection's fields, and counted; a
// malformed row fails with the file and line, and what is not a regular
// file inside the import root is refused.
func TestR10_3_ImportFileFormats(t *testing.T) {
	root := t.TempDir()
	good := []struct {
		name, content string
		rows          uint64
	}{
		{"a.jsonl", typedJSONRow + "\n\n" + typedJSONRow + "\n", 2},
		{"b.ndjson", typedJSONRow, 1},
		{"c.JSONL", "", 0},
		{"d.csv", typedCSVHeader + typedCSVRow + typedCSVRow + typedCSVRow, 3},
		{"e.csv", "\ufeff" + typedCSVHeader + typedCSVRow, 1},
		{"sub/dir/f.csv", strings.ReplaceAll(typedCSVHeader, "\n", "\r\n") + strings.ReplaceAll(typedCSVRow, "\n", "\r\n"), 1},
	}
	for _, g := range good {
		writeFile(t, filepath.Join(root, g.name), g.content)
		n, err := readImportFile(t, root, g.name, typedFields)
		if err != nil || n != g.rows {
			t.Errorf("%s: %d rows, %v; want %d rows", g.name, n, err, g.rows)
		}
	}

	// jsonRow is a valid row with field's value replaced, or removed if
	// value is "", or added if field is not in the schema.
	jsonRow := func(field, value string) string {
		base := map[string]string{"pk": "1", "small": "-8", "ok": "true", "score": "0.5", "exact": "1", "name": `"a"`,
			"meta": "{}", "emb": "[1, 2]", "bits": "[0, 1]"}
		var parts []string
		known := false
		for _, f := range typedFields {
			v := base[f.Name]
			if f.Name == field {
				known, v = true, value
			}
			if v != "" {
				parts = append(parts, `"`+f.Name+`": `+v)
			}
		}
		if !known {
			parts = append(parts, `"`+field+`": `+value)
		}
		return "{" + strings.Join(parts, ", ") + "}\n"
	}
	bad := []struct {
		name, content, want string
	}{
		{"int.jsonl", typedJSONRow + "\n" + jsonRow("pk", "1.5"), "line 2: field pk: 1.5 is not an int64"},
		{"int8.jsonl", jsonRow("small", "300"), "line 1: field small: 300 is not an int8"},
		{"bool.jsonl", jsonRow("ok", `"yes"`), `line 1: field ok: "yes" is not a bool`},
		{"float.jsonl", jsonRow("score", "1e40"), "line 1: field score: \"1e40\" is not a finite float"},
		{"str.jsonl", jsonRow("name", "7"), "line 1: field name: 7 is not a string"},
		{"null.jsonl", jsonRow("name", "null"), "line 1: field name is null"},
		{"vec.jsonl", jsonRow("emb", `"x"`), "line 1: field emb: not an array of float32 numbers"},
		{"empty-vec.jsonl", jsonRow("emb", "[]"), "line 1: field emb: empty vector"},
		{"dims.jsonl", jsonRow("emb", "[1, 2]") + jsonRow("emb", "[1, 2, 3]"), "line 2: field emb: 3 dimensions, earlier rows have 2"},
		{"bits.jsonl", jsonRow("bits", "[256]"), "line 1: field bits: 256 is not a byte"},
		{"missing.jsonl", jsonRow("exact", ""), "line 1: field exact is missing"},
		{"unknown.jsonl", jsonRow("extra", "1"), `line 1: unknown field "extra"`},
		{"array.jsonl", "[1, 2]\n", "line 1: not a JSON object"},
		{"garbage.jsonl", typedJSONRow + "\n{\"pk\": \n", "line 2: not JSON"},
		{"trailing.jsonl", typedJSONRow + " {}\n", "line 1: not JSON"},
		{"utf8.jsonl", "{\"name\": \"\xff\"}\n", "line 1: not UTF-8"},
		{"long.jsonl", typedJSONRow + "\n" + strings.Repeat(" ", MaxRowBytes+2) + "\n", "line 2: longer than"},
		{"empty.csv", "", "is empty: a CSV file starts with a header row"},
		{"header.csv", "pk,small\n1,2\n", "line 1: header: field"},
		{"header-unknown.csv", strings.TrimSuffix(typedCSVHeader, "\n") + ",extra\n", `line 1: header: unknown field "extra"`},
		{"header-twice.csv", "pk,pk\n", "line 1: header: field pk named twice"},
		{"count.csv", typedCSVHeader + typedCSVRow + "1,2\n", "line 3: wrong number of values: the header names 9 fields"},
		{"value.csv", typedCSVHeader + typedCSVRow + strings.Replace(typedCSVRow, "true", "maybe", 1), `line 3: field ok: "maybe" is not a bool`},
		{"json.csv", typedCSVHeader + strings.Replace(typedCSVRow, `"{""k"": [1]}"`, "{nope", 1), `line 2: field meta: "{nope" is not JSON`},
		{"quote.csv", typedCSVHeader + "1,\"unterminated\n", "line 2"},
		{"nan.csv", typedCSVHeader + strings.Replace(typedCSVRow, "0.5", "NaN", 1), `field score: "NaN" is not a finite float`},
	}
	for _, b := range bad {
		writeFile(t, filepath.Join(root, b.name), b.content)
		_, err := readImportFile(t, root, b.name, typedFields)
		var fe *fileError
		if !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), "file "+b.name) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: %v, want a file error saying %q", b.name, err, b.want)
		}
	}

	// Paths that are not regular files inside the root.
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret.csv"), typedCSVHeader)
	if err := os.Symlink(filepath.Join(outside, "secret.csv"), filepath.Join(root, "link.csv")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d.csv", filepath.Join(root, "inside.csv")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "outdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "dir.jsonl"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "pipe.jsonl"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"link.csv":          "escapes the import root",
		"outdir/secret.csv": "escapes the import root",
		"../x.csv":          "escapes the import root",
		"nope.jsonl":        "not found in the import root",
		"dir.jsonl":         "is not a regular file",
		"pipe.jsonl":        "is not a regular file",
	} {
		_, err := readImportFile(t, root, name, typedFields)
		if err == nil || !strings.HasPrefix(err.Error(), "file "+name+": ") || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
	if n, err := readImportFile(t, root, "inside.csv", typedFields); err != nil || n != 3 {
		t.Errorf("a symlink inside the root: %d rows, %v", n, err)
	}
	if os.Geteuid() != 0 { // root reads whatever the mode says
		writeFile(t, filepath.Join(root, "locked.csv"), typedCSVHeader)
		if err := os.Chmod(filepath.Join(root, "locked.csv"), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := readImportFile(t, root, "locked.csv", typedFields); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("unreadable file: %v", err)
		}
	}
}

// TestImportFilePathsChecked: the paths an Import request may name are
// local to the import root, free of control characters, distinct, and of a
// format the importer reads.
func TestImportFilePathsChecked(t *testing.T) {
	for _, ok := range [][]string{{"a.csv"}, {"d/e/f.jsonl", "g.ndjson"}, {"x.CSV"}, {"名前.jsonl"}} {
		if err := checkFiles(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range [][]string{
		{"/etc/passwd.csv"}, {"../a.csv"}, {"a/../../b.csv"}, {"a\x00.csv"}, {"a\nb.csv"}, {"a\u0085.csv"}, {`a\b.csv`},
		{"a.parquet"}, {"a"}, {"a.json"}, {"a.csv", "./a.csv"}, {""}, {"."},
	} {
		if err := checkFiles(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v, want ErrInvalidArgument", bad, err)
		}
	}
}
