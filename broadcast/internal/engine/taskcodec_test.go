package engine

import (
	"bytes"
	"fmt"
	"iter"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// decodeRecordProto is DecodeRecord through proto.Unmarshal, as it was
// before decodeTask: the reference decodeTask must agree with.
func decodeRecordProto(raw []byte) (*Record, error) {
	var pb durablepb.Task
	if err := proto.Unmarshal(raw, &pb); err != nil {
		return nil, err
	}
	m, err := message.Unmarshal(pb.Message)
	if err != nil {
		return nil, err
	}
	n := len(m.Broadcast.VChannels)
	if m.Broadcast.ID == 0 || n == 0 {
		return nil, fmt.Errorf("record has no broadcast id or targets")
	}
	if c := len(pb.Checkpoints); c != 0 && c != n {
		return nil, fmt.Errorf("record has %d checkpoints for %d vchannels", c, n)
	}
	st := stateFromPB(pb.State)
	if st == 0 {
		return nil, fmt.Errorf("record has unknown state %v", pb.State)
	}
	r := &Record{State: st, Msg: m, Message: pb.Message, Created: time.Unix(0, pb.CreatedUnixNano),
		PayloadDigest: pb.PayloadDigest, RequestDigest: pb.RequestDigest,
		Acked: make([]bool, n), Checkpoints: make([]wal.Checkpoint, n)}
	if pb.CompletedUnixNano != 0 {
		r.Completed = time.Unix(0, pb.CompletedUnixNano)
	}
	for i, c := range pb.Checkpoints {
		if c.Acked {
			r.Acked[i] = true
			r.Checkpoints[i] = checkpointOf(c.MessageId, c.TimeTick, c.LastConfirmed)
			if c.Extra != nil {
				if r.Extras == nil {
					r.Extras = make([][]byte, n)
				}
				r.Extras[i] = c.Extra
			}
		}
	}
	r.HoldsKeys = pb.HoldsKeys
	if pb.ReleasedUnixNano != 0 {
		r.Released = time.Unix(0, pb.ReleasedUnixNano)
	}
	r.ReleasedBy = pb.ReleasedBy
	if o := pb.Outcome; o != nil {
		r.Outcome = Outcome{Status: OutcomeStatus(o.Status), Detail: o.Detail, Data: o.Data}
	}
	return r, nil
}

// randomRecord is the encoding of a random task record, with the oddities
// an encoder other than walcast's may produce: fields repeated (the last
// wins), the outcome split in two (they merge), unknown fields, a known
// field with another wire type (skipped).
func randomRecord(r *rand.Rand) []byte {
	n := 1 + r.IntN(4)
	var vcs []message.VChannel
	for i := range n {
		vcs = append(vcs, message.VChannel(fmt.Sprintf("wal-%d/v%d", i, r.IntN(100))))
	}
	m, err := message.NewBroadcast(message.Type{Name: "T", Version: 1}, []byte(fmt.Sprint("payload", r.IntN(1000))), vcs)
	if err != nil {
		panic(err)
	}
	m.Broadcast.ID = 1 + r.Uint64N(1<<40)
	mb, err := message.Marshal(m)
	if err != nil {
		panic(err)
	}
	bytesOr := func(b []byte) []byte {
		if r.IntN(3) == 0 {
			return nil
		}
		return b
	}
	pb := &durablepb.Task{Message: mb, State: durablepb.TaskState(1 + r.IntN(3)), CreatedUnixNano: r.Int64(),
		PayloadDigest: bytesOr([]byte("pd")), RequestDigest: bytesOr([]byte("rd")), HoldsKeys: r.IntN(2) == 0}
	if r.IntN(2) == 0 {
		pb.CompletedUnixNano = r.Int64()
	}
	if r.IntN(2) == 0 {
		pb.ReleasedUnixNano, pb.ReleasedBy = r.Int64(), r.Uint64()
	}
	if r.IntN(4) != 0 {
		for range n {
			cp := &durablepb.Checkpoint{}
			if r.IntN(3) != 0 {
				cp = &durablepb.Checkpoint{Acked: true, MessageId: r.Uint64N(1000), TimeTick: r.Uint64N(3) * 7, LastConfirmed: r.Uint64N(3) * 5,
					Extra: bytesOr([]byte("extra"))}
			}
			pb.Checkpoints = append(pb.Checkpoints, cp)
		}
	}
	if r.IntN(2) == 0 {
		pb.Outcome = &durablepb.Outcome{Status: durablepb.OutcomeStatus(r.IntN(5)), Detail: "détail", Data: bytesOr([]byte{1, 2})}
	}
	out, err := proto.Marshal(pb)
	if err != nil {
		panic(err)
	}
	if r.IntN(3) == 0 { // a later state and creation time win
		out = protowire.AppendTag(out, taskState, protowire.VarintType)
		out = protowire.AppendVarint(out, uint64(1+r.IntN(3)))
		out = protowire.AppendTag(out, taskCreated, protowire.VarintType)
		out = protowire.AppendVarint(out, r.Uint64())
	}
	if r.IntN(3) == 0 { // a second outcome merges into the first
		o, _ := proto.Marshal(&durablepb.Outcome{Detail: "second"})
		out = protowire.AppendTag(out, taskOutcome, protowire.BytesType)
		out = protowire.AppendBytes(out, o)
	}
	if r.IntN(3) == 0 { // unknown fields of every wire type
		out = protowire.AppendTag(out, 99, protowire.VarintType)
		out = protowire.AppendVarint(out, 5)
		out = protowire.AppendTag(out, 100, protowire.BytesType)
		out = protowire.AppendBytes(out, []byte("x"))
		out = protowire.AppendTag(out, 101, protowire.Fixed64Type)
		out = protowire.AppendFixed64(out, 7)
		out = protowire.AppendTag(out, 102, protowire.Fixed32Type)
		out = protowire.AppendFixed32(out, 7)
	}
	if r.IntN(4) == 0 { // a known field with another wire type is unknown
		out = protowire.AppendTag(out, taskHoldsKeys, protowire.BytesType)
		out = protowire.AppendBytes(out, []byte{1})
	}
	return out
}

// TestDecodeTaskMatchesProto: DecodeRecord (decodeTask) and the same
// decoding through proto.Unmarshal give equal records for random records,
// and agree on which corrupted records to refuse.
func TestDecodeTaskMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		raw := randomRecord(r)
		check(t, fmt.Sprint("record ", i), raw)
		// Cut short and with a byte changed: both refuse or both read
		// the same.
		check(t, fmt.Sprint("record ", i, " cut"), raw[:r.IntN(len(raw))])
		bad := append([]byte(nil), raw...)
		bad[r.IntN(len(bad))] ^= byte(1 + r.IntN(255))
		check(t, fmt.Sprint("record ", i, " changed"), bad)
	}
}

func check(t *testing.T, what string, raw []byte) {
	t.Helper()
	got, err := DecodeRecord(raw)
	want, werr := decodeRecordProto(raw)
	if (err == nil) != (werr == nil) {
		t.Fatalf("%s: DecodeRecord error %v, proto.Unmarshal's %v\n%x", what, err, werr, raw)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: DecodeRecord\n%+v\nproto.Unmarshal\n%+v", what, got, want)
	}
}

// FuzzDecodeTask: for any bytes, DecodeRecord and proto.Unmarshal agree.
func FuzzDecodeTask(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		f.Add(randomRecord(r))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { check(t, "fuzzed record", raw) })
}

// encodeRecordProto is EncodeRecord through proto.Marshal, as it was before
// encodeTask: the reference its bytes must equal.
func encodeRecordProto(s *RecordSpec) (record, msg []byte, err error) {
	msg = s.Message
	if msg == nil {
		if msg, err = message.Marshal(s.Msg); err != nil {
			return nil, nil, fmt.Errorf("encode broadcast %d: %w", s.ID, err)
		}
	}
	pb := &durablepb.Task{
		Message:         msg,
		State:           stateToPB(s.State),
		CreatedUnixNano: s.Created.UnixNano(),
		PayloadDigest:   s.PayloadDigest,
		RequestDigest:   s.RequestDigest,
	}
	if !s.Completed.IsZero() {
		pb.CompletedUnixNano = s.Completed.UnixNano()
	}
	if s.Acked != nil {
		pb.Checkpoints = make([]*durablepb.Checkpoint, len(s.Acked))
		for i, a := range s.Acked {
			cp := &durablepb.Checkpoint{}
			if a {
				id, tick, last := checkpointFieldsOf(s.Checkpoints[i])
				cp = &durablepb.Checkpoint{Acked: true, MessageId: id, TimeTick: tick, LastConfirmed: last}
				if i < len(s.Extras) {
					cp.Extra = s.Extras[i]
				}
			}
			pb.Checkpoints[i] = cp
		}
	}
	if o := s.Outcome; o != nil {
		pb.Outcome = &durablepb.Outcome{Status: durablepb.OutcomeStatus(o.Status), Detail: o.Detail, Data: o.Data}
	}
	pb.HoldsKeys = s.HoldsKeys
	record, err = proto.MarshalOptions{Deterministic: true}.Marshal(pb)
	return record, msg, err
}

// TestEncodeTaskMatchesProto: EncodeRecord writes the bytes of
// proto.MarshalOptions{Deterministic: true} (a retried write writes the
// same bytes whichever version wrote the first), and DecodeRecord reads
// back what it wrote.
func TestEncodeTaskMatchesProto(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for i := range 2000 {
		n := 1 + r.IntN(4)
		var vcs []message.VChannel
		for j := range n {
			vcs = append(vcs, message.VChannel(fmt.Sprintf("wal-%d/v", j)))
		}
		m, err := message.NewBroadcast(message.Type{Name: "T", Version: 1}, []byte("p"), vcs)
		if err != nil {
			t.Fatal(err)
		}
		m.Broadcast.ID = 1 + r.Uint64N(1<<40)
		s := &RecordSpec{ID: m.Broadcast.ID, State: []State{Pending, Replicated, Tombstone}[r.IntN(3)], Msg: m,
			Created: time.Unix(0, r.Int64N(1<<62)), HoldsKeys: r.IntN(3) == 0}
		if r.IntN(3) == 0 {
			s.Created = time.Unix(0, -r.Int64N(1<<40)) // before 1970: a negative varint
		}
		if r.IntN(2) == 0 {
			s.PayloadDigest = []byte("digest")
		}
		if r.IntN(2) == 0 {
			s.RequestDigest = []byte("request")
		}
		if r.IntN(2) == 0 {
			s.Completed = time.Unix(0, r.Int64N(1<<62))
			s.Outcome = &Outcome{Status: OutcomeStatus(r.IntN(5))}
			if r.IntN(2) == 0 {
				s.Outcome.Detail, s.Outcome.Data = "détail", []byte{1}
			}
		}
		if r.IntN(3) != 0 {
			s.Acked, s.Checkpoints = make([]bool, n), make([]wal.Checkpoint, n)
			for j := range n {
				if r.IntN(3) == 0 {
					continue
				}
				id := 1 + r.Uint64N(1<<30)
				s.Acked[j], s.Checkpoints[j] = true, wal.Checkpoint{MessageID: id, TimeTick: id + r.Uint64N(2), LastConfirmed: id - r.Uint64N(2)}
				if r.IntN(2) == 0 {
					if s.Extras == nil {
						s.Extras = make([][]byte, n)
					}
					s.Extras[j] = []byte("extra")
				}
			}
		}
		got, gmsg, err := EncodeRecord(s)
		want, wmsg, werr := encodeRecordProto(s)
		if err != nil || werr != nil {
			t.Fatal(err, werr)
		}
		if !bytes.Equal(got, want) || !bytes.Equal(gmsg, wmsg) {
			t.Fatalf("record %d: EncodeRecord\n%x\nproto.Marshal\n%x", i, got, want)
		}
		if cap(got) != len(got) {
			t.Fatalf("record %d: %d bytes in a buffer of %d", i, len(got), cap(got))
		}
		if _, err := DecodeRecord(got); err != nil {
			t.Fatalf("record %d does not decode: %v", i, err)
		}
	}
}

// TestRecordIdentityMatchesDecodeRecord: the collector's identity of a
// record is what DecodeRecord gives those fields, for random records, cut
// and corrupted ones (wherever DecodeRecord reads the record).
func TestRecordIdentityMatchesDecodeRecord(t *testing.T) {
	for i, c := range decodableRecords(t, rand.New(rand.NewPCG(15, 16)), 3000) {
		id, err := recordIdentity(c.raw)
		if err != nil {
			t.Fatalf("record %d: DecodeRecord reads it, recordIdentity: %v", i, err)
		}
		want := message.Identity{Type: c.rec.Msg.Type, IdempotencyKey: c.rec.Msg.IdempotencyKey}
		if c.rec.Msg.Group != nil {
			want.OwnerKey = c.rec.Msg.Group.OwnerKey
		}
		if id != want {
			t.Fatalf("record %d: recordIdentity %+v, DecodeRecord %+v", i, id, want)
		}
	}
}

// TestRecordCreatedMatchesDecodeRecord: the creation time a tombstone's
// window reads from its record is DecodeRecord's, for random records, cut
// and corrupted ones.
func TestRecordCreatedMatchesDecodeRecord(t *testing.T) {
	for i, c := range decodableRecords(t, rand.New(rand.NewPCG(17, 18)), 3000) {
		created, err := recordCreated(c.raw)
		if err != nil {
			t.Fatalf("record %d: DecodeRecord reads it, recordCreated: %v", i, err)
		}
		if created != c.rec.Created.UnixNano() {
			t.Fatalf("record %d: recordCreated %d, DecodeRecord %d", i, created, c.rec.Created.UnixNano())
		}
	}
}

// recordCase is a record's encoding and what DecodeRecord read from it.
type recordCase struct {
	raw []byte
	rec *Record
}

// decodableRecords yields those of n random records, some cut and some
// corrupted, that DecodeRecord reads (with its number among the n), and
// fails t if fewer than a third were.
func decodableRecords(t *testing.T, r *rand.Rand, n int) iter.Seq2[int, recordCase] {
	return func(yield func(int, recordCase) bool) {
		read := 0
		for i := range n {
			raw := randomRecord(r)
			if r.IntN(2) == 0 {
				raw = raw[:r.IntN(len(raw))]
			}
			if r.IntN(3) == 0 && len(raw) > 0 {
				raw = append([]byte(nil), raw...)
				raw[r.IntN(len(raw))] ^= byte(1 + r.IntN(255))
			}
			rec, err := DecodeRecord(raw)
			if err != nil {
				continue
			}
			read++
			if !yield(i, recordCase{raw, rec}) {
				return
			}
		}
		if read < n/3 {
			t.Fatalf("only %d of %d random records decoded", read, n)
		}
	}
}
