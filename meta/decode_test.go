package meta

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/message"
)

// TestDecodeStrictSharesOneDecode: a CreateCollection payload decodes to
// the same value whether its bytes were decoded before (by another reader)
// or not; an unknown field is refused every time, never kept; the cache
// keeps its last sharedDecodes payloads and forgets the oldest.
func TestDecodeStrictSharesOneDecode(t *testing.T) {
	c := collRecord{ID: 7, DatabaseID: 3, Database: "db", Name: "c", Shards: 1,
		VChannels: []message.VChannel{"wal-1/c7v0"}, Fields: defaultFields, CreatedAt: 42}
	raw := mustJSON(createCollectionPayload{Collection: c})
	want, err := decodeStrictOnce[createCollectionPayload](raw)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // a miss, then a hit
		got, err := decodeStrict[createCollectionPayload](raw)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("decode %d: %+v (%v), want %+v", i, got, err, want)
		}
		if _, ok := recentDecodes.get(raw); !ok {
			t.Fatalf("decode %d: the payload is not kept", i)
		}
	}
	bad := []byte(`{"coll":{"id":7},"extra":1}`)
	for i := range 2 {
		if _, err := decodeStrict[createCollectionPayload](bad); err == nil {
			t.Fatalf("decode %d: a payload with an unknown field decoded", i)
		}
	}
	if _, ok := recentDecodes.get(bad); ok {
		t.Fatal("a payload that does not decode is kept")
	}
	// Types not marked readOnly are not kept.
	db := mustJSON(createDatabasePayload{Database: dbRecord{ID: 3, Name: "db"}})
	if _, err := decodeStrict[createDatabasePayload](db); err != nil {
		t.Fatal(err)
	}
	if _, ok := recentDecodes.get(db); ok {
		t.Fatal("a CreateDatabase payload is kept")
	}

	dc := newDecodeCache(4)
	for i := range 6 {
		dc.put(fmt.Appendf(nil, "p%d", i), i)
	}
	dc.put([]byte("p5"), 55) // present: keeps its slot
	if len(dc.m) != 4 {
		t.Fatalf("%d payloads kept, want 4", len(dc.m))
	}
	for i, want := range []any{nil, nil, 2, 3, 4, 55} {
		v, ok := dc.get(fmt.Appendf(nil, "p%d", i))
		if ok != (want != nil) || ok && v != want {
			t.Fatalf("p%d: %v %v, want %v", i, v, ok, want)
		}
	}
}

// TestCreateCollectionPayloadRoundTrips: what the service sends for a
// CreateCollection decodes to the value it encoded (the value decodeStrict
// then hands to the validator, the callback and the nodes of its process
// without decoding), for every field type, names of every character a name
// may hold, many shards and the default fields; one too large to keep (the
// most shards) is not kept.
func TestCreateCollectionPayloadRoundTrips(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	if _, err := e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "Db_9"}); err != nil {
		t.Fatal(err)
	}
	var fields []*walcastv1.Field
	for i, typ := range fieldTypes {
		fields = append(fields, &walcastv1.Field{Name: fmt.Sprintf("f_%d_%s", i, typ), Type: typ})
	}
	for _, req := range []*walcastv1.CreateCollectionRequest{
		{Database: "Db_9", Name: "c"},
		{Database: "Db_9", Name: "abcdefghijklmnopqrstuvwxyz_ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", Shards: 64, Fields: fields},
		{Database: "Db_9", Name: "large", Shards: MaxShards, Fields: fields},
		{Database: "Db_9", Name: "_1", Shards: 1, Fields: fields[:1]},
	} {
		res, err := e.c.CreateCollection(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		ti, err := e.b().Task(res.GetResult().GetBroadcastId())
		if err != nil {
			t.Fatal(err)
		}
		raw := ti.Message.Payload
		kept, ok := recentDecodes.get(raw)
		if len(raw) > maxSharedPayload {
			if ok {
				t.Fatalf("%s: a payload of %d bytes is kept", req.GetName(), len(raw))
			}
			continue
		}
		if !ok {
			t.Fatalf("%s: the payload sent is not kept", req.GetName())
		}
		decoded, err := decodeStrictOnce[createCollectionPayload](raw)
		if err != nil || !reflect.DeepEqual(kept, decoded) {
			t.Fatalf("%s: sent %+v, decodes to %+v (%v)", req.GetName(), kept, decoded, err)
		}
	}
}
