package meta

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/message"
)

// TestB13_CompactViewsRoundTrip: a shard's view that knows only its
// collection is saved in the compact form, smaller than its JSON, and
// decodes to the same view; any other view is saved as JSON; a view saved
// as JSON (by an earlier walcast) decodes as before.
func TestB13_CompactViewsRoundTrip(t *testing.T) {
	compact := []view{
		{},
		{CollectionID: 1000000, Collection: "c998999", DatabaseID: 991, Database: "s112525659_db999", Applied: 1, LastBroadcastID: 1000000},
		{CollectionID: 7, Collection: "é", DatabaseID: 3, Database: "db", Shard: 15, Dropped: true, Applied: 1 << 40, LastBroadcastID: 1<<64 - 1},
	}
	other := []view{
		{CollectionID: 7, Indexes: map[string]indexRecord{"i": {ID: 9, Name: "i", Field: "id", Type: "HNSW"}}, Applied: 2},
		{ImportJobs: []uint64{4}, Applied: 1},
		{Databases: map[string]dbRecord{"db": {ID: 3, Name: "db"}}, Applied: 1},
		{CollectionID: 7, Anomalies: []string{"x"}},
		{SplitFrom: "wal-0/c1v0"},
		{Shard: -1},
	}
	roundTrip := func(v view, wantCompact bool) {
		t.Helper()
		enc, err := encodeView(&v)
		if err != nil {
			t.Fatal(err)
		}
		js, err := json.Marshal(&v)
		if err != nil {
			t.Fatal(err)
		}
		if got := enc[0] == compactView; got != wantCompact {
			t.Fatalf("view %+v saved compact %v, want %v: %q", v, got, wantCompact, enc)
		}
		if wantCompact && len(enc) >= len(js) {
			t.Errorf("compact form of %+v is %d bytes, its JSON %d", v, len(enc), len(js))
		}
		for _, raw := range [][]byte{enc, js} {
			var got view
			if err := decodeView(raw, &got); err != nil {
				t.Fatalf("decode %q: %v", raw, err)
			}
			if !reflect.DeepEqual(got, v) {
				t.Errorf("decode %q = %+v, want %+v", raw, got, v)
			}
		}
	}
	for _, v := range compact {
		roundTrip(v, true)
	}
	for _, v := range other {
		roundTrip(v, false)
	}
}

// TestB13_CompactViewThatDoesNotDecode: every cut of a compact view, a
// byte too many, and unknown flags are refused with an error, not a panic
// or a wrong view.
func TestB13_CompactViewThatDoesNotDecode(t *testing.T) {
	enc, err := encodeView(&view{CollectionID: 7, Collection: "c", DatabaseID: 3, Database: "db", Applied: 1})
	if err != nil {
		t.Fatal(err)
	}
	bad := [][]byte{append(append([]byte(nil), enc...), 0)}
	for n := 1; n < len(enc); n++ {
		bad = append(bad, enc[:n])
	}
	bad = append(bad, []byte{compactView, 1, 1, 0, 1, 1, 2, 0, 0}, // flags 2
		[]byte{compactView, 1, 1, 0, 1, 1, 0, 200, 1, 'x', 0}) // a string longer than what follows
	for _, raw := range bad {
		var v view
		if err := decodeView(raw, &v); !errors.Is(err, errCompactView) {
			t.Errorf("decode %q: %v, want errCompactView", raw, err)
		}
	}
}

// TestB13_WholeSnapshotOfCompactViewsIsJSON: the node.Applier form of a
// pchannel (one JSON object) holds its cold compact views as JSON, and
// restores into the same views.
func TestB13_WholeSnapshotOfCompactViewsIsJSON(t *testing.T) {
	a := NewApplier("n1")
	vcs := []message.VChannel{"wal-0/c7v0", "wal-0/c8v0"}
	for i, vc := range vcs {
		raw, err := encodeView(&view{CollectionID: uint64(7 + i), Collection: "c", DatabaseID: 3, Database: "db", Applied: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.RestoreVChannel(vc, raw); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := a.Snapshot("wal-0")
	if err != nil || !json.Valid(snap) {
		t.Fatalf("snapshot %q, %v: want JSON", snap, err)
	}
	b := NewApplier("n1")
	if err := b.Restore("wal-0", snap); err != nil {
		t.Fatal(err)
	}
	for _, vc := range vcs {
		va, err := a.View(vc)
		if err != nil {
			t.Fatal(err)
		}
		vb, err := b.View(vc)
		if err != nil || !proto.Equal(va, vb) {
			t.Fatalf("view of %s restored from the whole snapshot: %v, want %v (%v)", vc, vb, va, err)
		}
	}
}

// TestB13_CompactViewKeepsEveryField: a view with any one of its saved
// fields set (each exported field in turn, so also one added later)
// decodes from its saved form to the same view: a field the compact form
// does not hold makes the view JSON, never lost.
func TestB13_CompactViewKeepsEveryField(t *testing.T) {
	base := view{CollectionID: 7, Collection: "c", DatabaseID: 3, Database: "db", Applied: 1}
	typ := reflect.TypeFor[view]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() {
			continue
		}
		v := base
		fv := reflect.ValueOf(&v).Elem().Field(i)
		switch fv.Kind() {
		case reflect.Bool:
			fv.SetBool(true)
		case reflect.Int, reflect.Int64:
			fv.SetInt(fv.Int() + 2)
		case reflect.Uint64:
			fv.SetUint(fv.Uint() + 2)
		case reflect.String:
			fv.SetString(fv.String() + "x")
		case reflect.Slice:
			s := reflect.MakeSlice(fv.Type(), 1, 1)
			fillNonZero(s.Index(0))
			fv.Set(s)
		case reflect.Map:
			m := reflect.MakeMap(fv.Type())
			k, e := reflect.New(fv.Type().Key()).Elem(), reflect.New(fv.Type().Elem()).Elem()
			fillNonZero(k)
			fillNonZero(e)
			m.SetMapIndex(k, e)
			fv.Set(m)
		default:
			t.Fatalf("field %s of kind %s: teach this test to set it", f.Name, fv.Kind())
		}
		enc, err := encodeView(&v)
		if err != nil {
			t.Fatal(err)
		}
		var got view
		if err := decodeView(enc, &got); err != nil {
			t.Fatalf("%s set: decode %q: %v", f.Name, enc, err)
		}
		if !reflect.DeepEqual(got, v) {
			t.Errorf("%s set: saved as %q, decoded %+v, want %+v", f.Name, enc, got, v)
		}
	}
}

// fillNonZero sets v (a string, number or struct of them) to something
// other than its zero value.
func fillNonZero(v reflect.Value) {
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Int, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint64:
		v.SetUint(1)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillNonZero(v.Field(i))
			}
		}
	}
}
