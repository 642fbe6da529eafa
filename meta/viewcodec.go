package meta

import (
	"encoding/binary"
	"encoding/json"
	"errors"
)

// A view is saved (by the node, through SnapshotVChannel) and kept cold in
// one of two forms. Most views at a million collections are a shard's that
// knows only its collection: those take a compact binary form, a third of
// their JSON (about 35 bytes against 100), which at a million collections
// is some 60 MB less live heap for the collector to work against its
// limit, and as much less in the nodes' state files. Any other view, and
// every view a node of an earlier walcast saved, is JSON; both decode.
//
// The compact form: compactView, then as uvarints CollectionID,
// DatabaseID, Shard, Applied, LastBroadcastID and the flags (flagDropped),
// then Collection and Database, each its length as a uvarint and its bytes.
const (
	compactView = 0x01 // never the first byte of JSON
	flagDropped = 1
)

// errCompactView is a compact view that does not decode.
var errCompactView = errors.New("a compact view that does not decode")

// compact reports whether v has nothing but what the compact form holds.
func (v *view) compact() bool {
	return v.Shard >= 0 && len(v.Indexes) == 0 && len(v.ImportJobs) == 0 && len(v.FinishedJobs) == 0 &&
		len(v.RolledBackJobs) == 0 && v.ImportedRows == 0 && !v.Fenced && len(v.SplitInto) == 0 &&
		v.FencedAt == 0 && v.SplitFrom == "" && len(v.Databases) == 0 && len(v.Users) == 0 &&
		len(v.Grants) == 0 && len(v.Anomalies) == 0
}

// encodeView is v's saved form: compact if it can be, else JSON.
func encodeView(v *view) ([]byte, error) {
	if !v.compact() {
		return json.Marshal(v)
	}
	var flags uint64
	if v.Dropped {
		flags |= flagDropped
	}
	b := make([]byte, 0, 1+5*binary.MaxVarintLen64+len(v.Collection)+len(v.Database)+4)
	b = append(b, compactView)
	for _, u := range []uint64{v.CollectionID, v.DatabaseID, uint64(v.Shard), v.Applied, v.LastBroadcastID, flags} {
		b = binary.AppendUvarint(b, u)
	}
	b = binary.AppendUvarint(b, uint64(len(v.Collection)))
	b = append(b, v.Collection...)
	b = binary.AppendUvarint(b, uint64(len(v.Database)))
	return append(b, v.Database...), nil
}

// decodeView decodes a saved view, of either form, into v.
func decodeView(raw []byte, v *view) error {
	if len(raw) == 0 || raw[0] != compactView {
		return json.Unmarshal(raw, v)
	}
	b := raw[1:]
	next := func() (uint64, bool) {
		u, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return u, true
	}
	var u [6]uint64
	for i := range u {
		var ok bool
		if u[i], ok = next(); !ok {
			return errCompactView
		}
	}
	if u[2] > uint64(^uint(0)>>1) || u[5]&^flagDropped != 0 {
		return errCompactView
	}
	var s [2]string
	for i := range s {
		n, ok := next()
		if !ok || n > uint64(len(b)) {
			return errCompactView
		}
		s[i], b = string(b[:n]), b[n:]
	}
	if len(b) != 0 {
		return errCompactView
	}
	*v = view{CollectionID: u[0], DatabaseID: u[1], Shard: int(u[2]), Applied: u[3], LastBroadcastID: u[4],
		Dropped: u[5]&flagDropped != 0, Collection: s[0], Database: s[1]}
	return nil
}
