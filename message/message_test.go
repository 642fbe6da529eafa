package message

import (
	"errors"
	"fmt"
	"testing"

	"github.com/walcast/walcast/resource"
)

var testType = Type{Name: "CreateCollection", Version: 1}

func TestR2_2_StampAddsControlChannelOnce(t *testing.T) {
	cc := PChannel("wal-0").Control()
	m, err := NewBroadcast(testType, []byte("p"), []VChannel{"wal-1/a", "wal-2/b"})
	if err != nil {
		t.Fatal(err)
	}
	keys := []resource.Key{resource.ExclusiveCollection("db", "c"), resource.SharedCluster()}
	s, err := m.Stamp(42, cc, keys)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(s.Broadcast.VChannels); got != "[wal-1/a wal-2/b wal-0/_control]" {
		t.Fatalf("targets %s", got)
	}
	if m.Broadcast.ID != 0 || len(m.Broadcast.VChannels) != 2 {
		t.Fatal("Stamp modified its receiver")
	}
	// A broadcast that already names the control channel keeps it once.
	m2, _ := NewBroadcast(testType, nil, []VChannel{cc})
	s2, err := m2.Stamp(43, cc, nil)
	if err != nil || len(s2.Broadcast.VChannels) != 1 {
		t.Fatalf("control-only broadcast: %v %v", s2, err)
	}
	if _, err := s.Stamp(44, cc, nil); !errors.Is(err, ErrAlreadyStamped) {
		t.Fatalf("second Stamp: %v", err)
	}
	if _, err := m.Stamp(0, cc, nil); !errors.Is(err, ErrUnstamped) {
		t.Fatalf("Stamp(0): %v", err)
	}
	if _, err := m.Stamp(5, "bad", nil); !errors.Is(err, ErrInvalidChannel) {
		t.Fatalf("bad control channel: %v", err)
	}
}

func TestR2_3_SplitKeepsHeaderKeyAndTrace(t *testing.T) {
	k := CollectionKey(7, "req-1")
	m, err := NewBroadcast(testType, []byte("payload"), []VChannel{"wal-1/a", "wal-1/b"}, WithIdempotencyKey(k), WithAckSyncUp(), WithProperty("x", "y"))
	if err != nil {
		t.Fatal(err)
	}
	m.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	s, err := m.Stamp(9, "wal-0/_control", []resource.Key{resource.SharedCluster()})
	if err != nil {
		t.Fatal(err)
	}
	copies, err := s.Split()
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 3 {
		t.Fatalf("%d copies, want 3", len(copies))
	}
	for i, c := range copies {
		if c.VChannel != s.Broadcast.VChannels[i] {
			t.Errorf("copy %d is for %s", i, c.VChannel)
		}
		h := c.Message.Broadcast
		if h.ID != 9 || !h.AckSyncUp || len(h.ResourceKeys) != 1 || c.Message.IdempotencyKey != k ||
			c.Message.TraceParent != m.TraceParent || c.Message.Properties["x"] != "y" {
			t.Errorf("copy %d lost part of the header: %+v", i, c.Message)
		}
	}
}

func TestR2_3_TypedBuildErrors(t *testing.T) {
	cases := []struct {
		name    string
		targets []VChannel
		want    error
	}{
		{"empty", nil, ErrNoTargets},
		{"duplicate", []VChannel{"p/a", "p/b", "p/a"}, ErrDuplicateVChannel},
		{"malformed", []VChannel{"p/a", "no-slash"}, ErrInvalidChannel},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := NewBroadcast(testType, nil, c.targets); !errors.Is(err, c.want) {
				t.Fatalf("NewBroadcast = %v, want %v", err, c.want)
			}
			// The same checks guard Split of a hand-built message.
			m := &Message{Type: testType, Broadcast: BroadcastHeader{ID: 1, VChannels: c.targets}}
			if _, err := m.Split(); !errors.Is(err, c.want) {
				t.Fatalf("Split = %v, want %v", err, c.want)
			}
		})
	}
	m := &Message{Type: testType, Broadcast: BroadcastHeader{VChannels: []VChannel{"p/a"}}}
	if _, err := m.Split(); !errors.Is(err, ErrUnstamped) {
		t.Fatalf("Split of unstamped = %v", err)
	}
	if _, err := NewBroadcast(testType, nil, []VChannel{"p/a"}, WithIdempotencyKey("1:01:x")); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("malformed key accepted: %v", err)
	}
}

func TestR2_5_Registry(t *testing.T) {
	r := NewRegistry()
	info := TypeInfo{Type: testType, ExclusiveAppend: true, AckSyncUp: true, Validate: func(p []byte) error {
		if len(p) == 0 {
			return errors.New("empty payload")
		}
		return nil
	}}
	if err := r.Register(info); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(info); !errors.Is(err, ErrInvalidType) {
		t.Fatalf("duplicate registration: %v", err)
	}
	for _, bad := range []Type{{Name: "", Version: 1}, {Name: "X", Version: 0}, {Name: "a b", Version: 1}} {
		if err := r.Register(TypeInfo{Type: bad}); !errors.Is(err, ErrInvalidType) {
			t.Errorf("Register(%v) = %v", bad, err)
		}
	}
	got, ok := r.Lookup(testType)
	if !ok || !got.ExclusiveAppend || !got.AckSyncUp || got.Unreplicable {
		t.Fatalf("Lookup = %+v, %v", got, ok)
	}
	if _, err := r.Check(&Message{Type: testType}); !errors.Is(err, ErrInvalidPayload) {
		t.Fatalf("validator not applied: %v", err)
	}
	if _, err := r.Check(&Message{Type: Type{Name: "Nope", Version: 1}}); !errors.Is(err, ErrUnknownType) {
		t.Fatalf("unknown type: %v", err)
	}
	if _, err := r.Check(&Message{Type: testType, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	pt, err := ParseType(testType.String())
	if err != nil || pt != testType {
		t.Fatalf("ParseType(%q) = %v, %v", testType.String(), pt, err)
	}
	for s, want := range map[string]Type{
		"CreateCollection.v1": {Name: "CreateCollection", Version: 1}, "Generic.v0": {Name: "Generic"},
		"a.b.v12": {Name: "a.b", Version: 12}, "x.v4294967295": {Name: "x", Version: 4294967295},
		"x.v1.v2": {Name: "x.v1", Version: 2},
	} {
		if got, err := ParseType(s); err != nil || got != want || got.String() != s {
			t.Errorf("ParseType(%q) = %v, %v; want %v, written back as %q", s, got, err, want, s)
		}
	}
	for _, s := range []string{"", "x", ".v1", "v1", "x.v", "x.v01", "x.v00", "x.v-1", "x.v+1", "x.v1a", "x.v 1",
		"x.v4294967296", "x.v2.y", "x.v١"} {
		if _, err := ParseType(s); !errors.Is(err, ErrUnknownType) {
			t.Errorf("ParseType(%q) = %v, want ErrUnknownType", s, err)
		}
	}
}

func TestCloneIsDeep(t *testing.T) {
	m := &Message{Type: testType, Payload: []byte("a"), Properties: map[string]string{"k": "v"},
		Broadcast: BroadcastHeader{VChannels: []VChannel{"p/a"}}, Replicate: &ReplicateHeader{SourceCluster: "x"}}
	c := m.Clone()
	c.Payload[0] = 'b'
	c.Properties["k"] = "w"
	c.Broadcast.VChannels[0] = "p/b"
	c.Replicate.SourceCluster = "y"
	if string(m.Payload) != "a" || m.Properties["k"] != "v" || m.Broadcast.VChannels[0] != "p/a" || m.Replicate.SourceCluster != "x" {
		t.Fatal("Clone shares state with the original")
	}
	if m.WithoutReplicateHeader().Replicate != nil || m.Replicate == nil {
		t.Fatal("WithoutReplicateHeader")
	}
}
