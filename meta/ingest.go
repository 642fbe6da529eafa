package meta

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// An import file's format, by its extension (formatOf).
type format int

const (
	// formatJSONL is JSON lines (.jsonl, .ndjson): one JSON object per line,
	// its keys the collection's fields; blank lines are skipped.
	formatJSONL format = iota + 1
	// formatCSV is CSV (.csv, RFC 4180): a header row naming the fields,
	// then one row per record.
	formatCSV
)

// errFormat explains which files the importer reads. Parquet would need a
// dependency as large as the rest of walcast (arrow-go or parquet-go); the
// reference application does without it.
var errFormat = errors.New("unsupported format: import JSON lines (.jsonl, .ndjson) or CSV (.csv) files; Parquet is not supported")

func formatOf(name string) (format, error) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".jsonl", ".ndjson":
		return formatJSONL, nil
	case ".csv":
		return formatCSV, nil
	}
	return 0, errFormat
}

// fileError is a problem with one import file, at a line if line > 0. It
// fails the job: the file must be fixed, and imported under a new key.
type fileError struct {
	file string
	line int
	msg  string
}

func (e *fileError) Error() string {
	if e.line > 0 {
		return fmt.Sprintf("file %s, line %d: %s", printable(e.file), e.line, e.msg)
	}
	return fmt.Sprintf("file %s: %s", printable(e.file), e.msg)
}

// rowChecker validates rows against a collection's fields: every field
// present, no other key, each value of its field's type, and every vector
// of a field with the same number of dimensions within one file.
type rowChecker struct {
	fields map[string]fieldRecord
	order  []fieldRecord  // the schema's order, which messages follow
	names  string         // the field names, for messages
	dims   map[string]int // vector field → dimensions of the file's first row
}

func newRowChecker(fs []fieldRecord) *rowChecker {
	c := &rowChecker{fields: make(map[string]fieldRecord, len(fs)), order: fs, dims: map[string]int{}}
	names := make([]string, len(fs))
	for i, f := range fs {
		c.fields[f.Name] = f
		names[i] = f.Name
	}
	c.names = strings.Join(names, ", ")
	return c
}

// jsonValue checks one JSON value of field f.
func (c *rowChecker) jsonValue(f fieldRecord, raw json.RawMessage) error {
	s := string(raw)
	if s == "null" {
		return fmt.Errorf("field %s is null", f.Name)
	}
	switch f.Type {
	case "bool":
		if s != "true" && s != "false" {
			return fmt.Errorf("field %s: %s is not a bool", f.Name, short(s))
		}
	case "int8", "int16", "int32", "int64":
		bits, _ := strconv.Atoi(f.Type[3:])
		if _, err := strconv.ParseInt(s, 10, bits); err != nil {
			return fmt.Errorf("field %s: %s is not an %s", f.Name, short(s), f.Type)
		}
	case "float", "double":
		if s[0] != '-' && (s[0] < '0' || s[0] > '9') {
			return fmt.Errorf("field %s: %s is not a number", f.Name, short(s))
		}
		return c.scalar(f, s)
	case "varchar":
		if s[0] != '"' {
			return fmt.Errorf("field %s: %s is not a string", f.Name, short(s))
		}
	case "json":
		// Any JSON value: the row decoded, so it is valid.
	case "float_vector", "binary_vector":
		return c.vector(f, raw)
	}
	return nil
}

// csvValue checks one CSV value of field f.
func (c *rowChecker) csvValue(f fieldRecord, s string) error {
	switch f.Type {
	case "bool":
		if _, err := strconv.ParseBool(s); err != nil {
			return fmt.Errorf("field %s: %q is not a bool", f.Name, short(s))
		}
	case "int8", "int16", "int32", "int64":
		bits, _ := strconv.Atoi(f.Type[3:])
		if _, err := strconv.ParseInt(s, 10, bits); err != nil {
			return fmt.Errorf("field %s: %q is not an %s", f.Name, short(s), f.Type)
		}
	case "float", "double":
		return c.scalar(f, s)
	case "varchar":
		if !utf8.ValidString(s) {
			return fmt.Errorf("field %s is not UTF-8", f.Name)
		}
	case "json":
		if !json.Valid([]byte(s)) {
			return fmt.Errorf("field %s: %q is not JSON", f.Name, short(s))
		}
	case "float_vector", "binary_vector":
		return c.vector(f, []byte(s))
	}
	return nil
}

// scalar checks a float or double.
func (c *rowChecker) scalar(f fieldRecord, s string) error {
	bits := 64
	if f.Type == "float" {
		bits = 32
	}
	v, err := strconv.ParseFloat(s, bits)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Errorf("field %s: %q is not a finite %s", f.Name, short(s), f.Type)
	}
	return nil
}

// vector checks a vector, given as a JSON array: of float32 numbers
// (float_vector) or of bytes 0..255 (binary_vector), not empty, with the
// dimensions of the file's earlier rows.
func (c *rowChecker) vector(f fieldRecord, raw []byte) error {
	var n int
	if f.Type == "float_vector" {
		var v []float32
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("field %s: not an array of float32 numbers", f.Name)
		}
		n = len(v)
	} else {
		var v []int
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("field %s: not an array of bytes (0 to 255)", f.Name)
		}
		for _, b := range v {
			if b < 0 || b > 255 {
				return fmt.Errorf("field %s: %d is not a byte (0 to 255)", f.Name, b)
			}
		}
		n = len(v)
	}
	if n == 0 {
		return fmt.Errorf("field %s: empty vector", f.Name)
	}
	if want, ok := c.dims[f.Name]; !ok {
		c.dims[f.Name] = n
	} else if n != want {
		return fmt.Errorf("field %s: %d dimensions, earlier rows have %d", f.Name, n, want)
	}
	return nil
}

// jsonRow checks one JSON lines row.
func (c *rowChecker) jsonRow(line []byte) error {
	var row map[string]json.RawMessage
	if err := json.Unmarshal(line, &row); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return errors.New("not a JSON object")
		}
		return fmt.Errorf("not JSON: %v", err)
	}
	if row == nil {
		return errors.New("not a JSON object")
	}
	if len(row) > len(c.order) {
		for k := range row {
			if _, ok := c.fields[k]; !ok {
				return fmt.Errorf("unknown field %q (the collection's fields: %s)", short(k), c.names)
			}
		}
	}
	for _, f := range c.order {
		raw, ok := row[f.Name]
		if !ok {
			for k := range row {
				if _, ok := c.fields[k]; !ok {
					return fmt.Errorf("unknown field %q (the collection's fields: %s)", short(k), c.names)
				}
			}
			return fmt.Errorf("field %s is missing", f.Name)
		}
		if err := c.jsonValue(f, raw); err != nil {
			return err
		}
	}
	return nil
}

// short quotes at most 40 bytes of a value for a message.
func short(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// fileReader reads one import file.
type fileReader struct {
	ctx  context.Context
	name string
	chk  *rowChecker
	// progress, if set, is called with the rows and bytes read so far, at
	// most every progressEvery.
	progress func(rows, bytes uint64)
	last     time.Time
	rows     uint64
	// bytes counts the bytes read from the file (read sets it up).
	bytes countingReader
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n uint64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += uint64(k)
	return k, err
}

// progressEvery is how often the importer records the rows of a file it is
// reading.
const progressEvery = time.Second

// row counts a validated row, and every 1024 rows checks the context and
// reports progress.
func (fr *fileReader) row() error {
	fr.rows++
	if fr.rows%1024 != 0 {
		return nil
	}
	if err := fr.ctx.Err(); err != nil {
		return err
	}
	if fr.progress != nil && time.Since(fr.last) >= progressEvery {
		fr.last = time.Now()
		fr.progress(fr.rows, fr.bytes.n)
	}
	return nil
}

func (fr *fileReader) errAt(line int, format string, args ...any) error {
	return &fileError{file: fr.name, line: line, msg: fmt.Sprintf(format, args...)}
}

// openImport opens name under the import root dir through root, which
// refuses paths that leave it (".." or a symlink out of it). It refuses what
// is not a regular file (a directory, a FIFO, a device) without blocking on
// it. Errors are fileErrors naming the file.
func openImport(root *os.Root, dir, name string) (*os.File, error) {
	fail := func(format string, args ...any) error {
		return &fileError{file: name, msg: fmt.Sprintf(format, args...)}
	}
	// For a clear message first: where the path leads.
	if real, err := filepath.EvalSymlinks(filepath.Join(dir, name)); err == nil {
		realRoot, rerr := filepath.EvalSymlinks(dir)
		if rel, err := filepath.Rel(realRoot, real); rerr == nil && (err != nil || !filepath.IsLocal(rel)) {
			return nil, fail("escapes the import root %s (through a symlink)", dir)
		}
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fail("not found in the import root %s", dir)
	case errors.Is(err, fs.ErrPermission):
		return nil, fail("cannot be read: permission denied")
	case err != nil && strings.Contains(err.Error(), "escapes"):
		return nil, fail("escapes the import root %s", dir)
	case err != nil:
		return nil, fail("cannot be opened: %v", unwrapPath(err))
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fail("cannot be read: %v", unwrapPath(err))
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fail("is not a regular file (%v)", st.Mode().Type())
	}
	return f, nil
}

// unwrapPath drops a PathError's operation and path, which repeat what the
// message says.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// read validates and counts the rows of file f.
func (fr *fileReader) read(f io.Reader) (uint64, error) {
	format, err := formatOf(fr.name)
	if err != nil {
		return 0, fr.errAt(0, "%v", err)
	}
	fr.bytes = countingReader{r: f}
	lr := &lineLimit{r: &fr.bytes}
	if format == formatJSONL {
		err = fr.readJSONL(lr)
	} else {
		err = fr.readCSV(lr)
	}
	var fe *fileError
	if err != nil && !errors.As(err, &fe) && fr.ctx.Err() == nil {
		err = fr.errAt(0, "cannot be read: %v", unwrapPath(err))
	}
	return fr.rows, err
}

func (fr *fileReader) readJSONL(r *lineLimit) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxRowBytes+1)
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if !utf8.Valid(b) {
			return fr.errAt(line, "not UTF-8")
		}
		if err := fr.chk.jsonRow(b); err != nil {
			return fr.errAt(line, "%v", err)
		}
		if err := fr.row(); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) || errors.Is(err, errLineTooLong) {
			return fr.errAt(line+1, "longer than %d bytes", MaxRowBytes)
		}
		return err
	}
	return nil
}

func (fr *fileReader) readCSV(r *lineLimit) error {
	br := bufio.NewReader(r)
	if bom, err := br.Peek(3); err == nil && string(bom) == "\ufeff" {
		_, _ = br.Discard(3)
	}
	cr := csv.NewReader(br)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return fr.errAt(0, "is empty: a CSV file starts with a header row naming the fields")
	}
	if err != nil {
		return fr.csvErr(err, 0)
	}
	cols := make([]fieldRecord, len(header))
	for i, h := range header {
		f, ok := fr.chk.fields[h]
		if !ok {
			return fr.errAt(1, "header: unknown field %q (the collection's fields: %s)", short(h), fr.chk.names)
		}
		if j := slices.IndexFunc(cols[:i], func(c fieldRecord) bool { return c.Name == h }); j >= 0 {
			return fr.errAt(1, "header: field %s named twice", h)
		}
		cols[i] = f
	}
	for _, f := range fr.chk.order {
		if !slices.Contains(header, f.Name) {
			return fr.errAt(1, "header: field %s is missing", f.Name)
		}
	}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fr.csvErr(err, len(header))
		}
		for i, v := range rec {
			if err := fr.chk.csvValue(cols[i], v); err != nil {
				line, _ := cr.FieldPos(i)
				return fr.errAt(line, "%v", err)
			}
		}
		if err := fr.row(); err != nil {
			return err
		}
	}
}

// csvErr names the line of a CSV parse error; cols is the header's length.
func (fr *fileReader) csvErr(err error, cols int) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		if errors.Is(pe.Err, errLineTooLong) {
			return fr.errAt(pe.Line, "longer than %d bytes", MaxRowBytes)
		}
		if errors.Is(pe.Err, csv.ErrFieldCount) {
			return fr.errAt(pe.StartLine, "wrong number of values: the header names %d fields", cols)
		}
		return fr.errAt(pe.Line, "%v", pe.Err)
	}
	if errors.Is(err, errLineTooLong) {
		return fr.errAt(0, "a line is longer than %d bytes", MaxRowBytes)
	}
	return err
}

// errLineTooLong reports a line of more than MaxRowBytes.
var errLineTooLong = errors.New("line too long")

// lineLimit fails a read once a line grows beyond MaxRowBytes, so that a
// file without newlines cannot make the importer buffer it whole.
type lineLimit struct {
	r    io.Reader
	line int // bytes since the last newline
}

func (l *lineLimit) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for _, b := range p[:n] {
		if b == '\n' {
			l.line = 0
			continue
		}
		l.line++
		if l.line > MaxRowBytes+1 {
			return 0, errLineTooLong
		}
	}
	return n, err
}
