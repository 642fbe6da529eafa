package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/json")

// golden compares got with testdata/json/<name>.golden (-update rewrites it).
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "json", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/walcast -run TestJSONGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s:\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

// at is a fixed time of the golden files.
var at = timestamppb.New(time.Date(2026, 12, 1, 10, 19, 10, 123456000, time.UTC))

func goldenTask() *walcastv1.Task {
	return &walcastv1.Task{Id: 18446744073709551615, Type: "CreateCollection.v1", State: "PENDING", Stage: "queued", CreatedAt: at,
		ResourceKeys: []string{"Collection:db1:c1@X", "Database:db1@R", "Cluster:@R"}, KeyFingerprint: "fe109cc2a1b2c3d4",
		AckSyncUp: true, CatalogCommits: 1, CatalogCommitsKnown: true, Payload: []byte("hello"),
		Vchannels: []*walcastv1.VChannelState{
			{Vchannel: "wal-0/_control", Appended: true, Acked: true, Checkpoint: &walcastv1.Checkpoint{MessageId: 65538, TimeTick: 65538, LastConfirmed: 65538}},
			{Vchannel: "wal-1/c1v0", Appended: true}},
		Callback: &walcastv1.CallbackState{Attempts: 2, LastError: "downstream is down", LastAttemptAt: at}}
}

// TestR9_5_CopiesHaveOneJSONShape: "where did the copies land" is the same
// array of the same objects in broadcast's output, tasks show's and a
// metadata command's (docs/cli.md): vchannel, appended, acked, message_id,
// time_tick, last_confirmed, sorted by vchannel.
func TestR9_5_CopiesHaveOneJSONShape(t *testing.T) {
	res := &client.BroadcastResult{BroadcastID: 7, Appends: map[message.VChannel]*walcastv1.Checkpoint{
		"wal-1/c1v0": {MessageId: 65536, TimeTick: 65536}, "wal-0/_control": {MessageId: 65538, TimeTick: 65538, LastConfirmed: 65538}}}
	outputs := map[string]any{
		"broadcast":  newBroadcastOutput(&client.BroadcastRequest{}, res).value(),
		"tasks show": taskValue(goldenTask()),
		"db create":  with(protoValue(&walcastv1.CreateDatabaseResponse{Result: &walcastv1.DDLResult{BroadcastId: 7}}), "copies", taskCopies(goldenTask())),
	}
	var shapes []string
	for name, v := range outputs {
		var buf bytes.Buffer
		if err := emit(&buf, formatJSON, v); err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Copies []map[string]any `json:"copies"`
		}
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		if len(doc.Copies) != 2 || doc.Copies[0]["vchannel"] != "wal-0/_control" || doc.Copies[1]["vchannel"] != "wal-1/c1v0" ||
			doc.Copies[0]["message_id"] != float64(65538) {
			t.Errorf("%s: copies %v", name, doc.Copies)
		}
		var keys []string
		for _, c := range doc.Copies {
			keys = append(keys, strings.Join(slices.Sorted(maps.Keys(c)), ","))
		}
		shapes = append(shapes, strings.Join(keys, ";"))
	}
	for _, s := range shapes[1:] {
		if s != shapes[0] || s != "acked,appended,last_confirmed,message_id,time_tick,vchannel;acked,appended,last_confirmed,message_id,time_tick,vchannel" {
			t.Errorf("the copies' shapes differ: %q", shapes)
		}
	}
}

// TestJSONGolden: the machine output of representative results, as
// scripts read them, is exactly the golden files.
func TestJSONGolden(t *testing.T) {
	tomb := goldenTask()
	tomb.State, tomb.Stage, tomb.CompletedAt, tomb.CatalogCommitsKnown, tomb.CatalogCommits = "TOMBSTONE", "tombstoned", at, false, 0
	tomb.Outcome = &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED, Detail: "import job 4 created", Data: []byte("4")}
	tomb.ApplicationOutcome = &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_FAILED, Detail: "import job 4 failed: file a.csv, line 3"}
	res := &client.BroadcastResult{BroadcastID: 7, Duplicated: true, Attempts: 2, IdempotencyKey: message.ClusterKey("my-request-1"),
		Appends: map[message.VChannel]*walcastv1.Checkpoint{"wal-0/_control": {MessageId: 65538, TimeTick: 65538}, "wal-1/c1v0": {MessageId: 65536, TimeTick: 65536}},
		Outcome: &walcastv1.Outcome{Status: walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED},
		Window:  &walcastv1.Window{FirstSeen: at, CompletedAt: at, ExpiresLatest: at, CountHeadroom: 8191}}
	cases := map[string]any{
		"task":       taskValue(goldenTask()),
		"tombstone":  taskValue(tomb),
		"tasks_list": (&taskList{tasks: []*walcastv1.Task{goldenTask()}, more: true, cursor: 18446744073709551615}).value(),
		"broadcast":  newBroadcastOutput(&client.BroadcastRequest{ClientKey: "my-request-1"}, res).value(),
		"locks": protoValue(&walcastv1.ListLocksResponse{Locks: []*walcastv1.LockState{{Domain: "Collection", Name: "db1:c1",
			Holders: []*walcastv1.LockHolder{{Owner: "broadcast 7", Mode: "X", Since: at}}, Waiters: []*walcastv1.LockHolder{{Owner: "handle 9", Mode: "R", Since: at}}}}}),
		"key": with(protoValue(&walcastv1.LookupKeyResponse{BroadcastId: 7, State: "TOMBSTONE", Outcome: res.Outcome, Window: res.Window}),
			"key_fingerprint", message.ClusterKey("my-request-1").Fingerprint()),
		"replication_status": protoValue(&walcastv1.ReplicationStatusResponse{Cluster: "west", Role: "secondary", PchannelCount: 4, Lanes: 1,
			Topology: &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: "nats://127.0.0.1:7072"}}},
			Source:   &walcastv1.SourceState{Url: "nats://127.0.0.1:7072", LastError: "wal-0: nats: timeout", UnreachableSince: at, LastContact: at},
			Pchannels: []*walcastv1.PChannelReplication{{Pchannel: "wal-0", Next: 12, Copied: 12, LastCopy: at, LastError: "nats: timeout"},
				{Pchannel: "wal-1", Next: 3, SourceEnd: 5, Lag: 2, LagKnown: true, SourceEndAt: at}},
			Incomplete: []*walcastv1.IncompleteTask{{Id: 9, Type: "CreateCollection.v1", State: "REPLICATED", Acked: 1, Vchannels: 3}}}),
		"import_start": with(protoValue(&walcastv1.ImportResponse{Result: &walcastv1.DDLResult{BroadcastId: 3},
			Job: &walcastv1.ImportJob{Id: 3, DatabaseId: 1, CollectionId: 2, Collection: "orders", Database: "shop", Files: []string{"orders/a.jsonl"},
				State: walcastv1.ImportJobState_IMPORT_JOB_STATE_PENDING, CreatedAt: at, UpdatedAt: at, AutoCommit: true}}), "idempotency_key", "imp-1",
			"copies", taskCopies(goldenTask())),
		"error": object{"error": object{"kind": "not_found", "message": "walcast: not_found: task 9 not found", "exit_code": 1}},
	}
	for name, v := range cases {
		var buf bytes.Buffer
		if err := emit(&buf, formatJSON, v); err != nil {
			t.Fatal(err)
		}
		checkConventions(t, name, buf.Bytes())
		golden(t, name, buf.Bytes())
	}
}

var (
	rfc3339 = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$`)
	numeric = regexp.MustCompile(`^-?\d+$`)
)

// checkConventions checks a machine output against the conventions of
// output.go: snake_case keys, numbers as numbers, lower-case enum words,
// RFC 3339 times.
func checkConventions(t *testing.T, name string, raw []byte) {
	t.Helper()
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", name, err, raw)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if !regexp.MustCompile(`^[a-z][a-z0-9_]*$`).MatchString(k) && !strings.Contains(k, "/") { // map keys are vchannels
					t.Errorf("%s: key %q of %s is not snake_case", name, k, path)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for _, e := range x {
				walk(path+"[]", e)
			}
		case string:
			field := path[strings.LastIndex(path, ".")+1:]
			switch {
			case strings.HasSuffix(field, "_at") || field == "since" || field == "first_seen" || field == "expires_latest" || field == "last_copy" || field == "last_contact":
				if !rfc3339.MatchString(x) {
					t.Errorf("%s: %s = %q is not an RFC 3339 time", name, path, x)
				}
			case numeric.MatchString(x) && field != "data" && field != "idempotency_key" && field != "client_key" && field != "name":
				t.Errorf("%s: %s = %q is a number as a string", name, path, x)
			case field == "state" || field == "status" || field == "mode" || field == "role" || field == "stage":
				if x != strings.ToLower(x) || strings.Contains(x, "_STATUS_") {
					t.Errorf("%s: %s = %q is not a lower-case word", name, path, x)
				}
			}
		}
	}
	walk(name, v)
}

// TestJSONConventions fills every field of every message of the API with a
// value and checks that its machine output follows the conventions, so a
// new field cannot slip through in protojson's style.
func TestJSONConventions(t *testing.T) {
	n := 0
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		if !strings.HasPrefix(string(mt.Descriptor().FullName()), "walcast.api.v1.") {
			return true
		}
		m := mt.New()
		fill(m, 2)
		var buf bytes.Buffer
		if err := emit(&buf, formatJSON, protoValue(m.Interface())); err != nil {
			t.Fatal(err)
		}
		checkConventions(t, string(mt.Descriptor().Name()), buf.Bytes())
		// Every field is present, set or not.
		var got map[string]any
		if err := json.Unmarshal(protoJSON(t, mt.New().Interface()), &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != mt.Descriptor().Fields().Len() {
			t.Errorf("%s: %d keys for %d fields in the output of an empty message", mt.Descriptor().Name(), len(got), mt.Descriptor().Fields().Len())
		}
		n++
		return true
	})
	if n < 40 {
		t.Fatalf("checked %d messages of the API: the registry does not hold them all", n)
	}
}

func protoJSON(t *testing.T, m proto.Message) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := emit(&buf, formatJSON, protoValue(m)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// fill sets every field of m to a non-zero value, messages depth levels
// deep: big numbers, upper-case words in enum-like strings, times.
func fill(m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.ContainingOneof() != nil && i > 0 && fields.Get(i-1).ContainingOneof() == fd.ContainingOneof() {
			continue
		}
		value := func() (protoreflect.Value, bool) { return scalarOf(m, fd, depth) }
		switch {
		case fd.IsList():
			v, ok := value()
			if ok {
				m.Mutable(fd).List().Append(v)
			}
		case fd.IsMap():
			var v protoreflect.Value
			ok := true
			if fd.MapValue().Kind() == protoreflect.MessageKind {
				sub := m.NewField(fd).Map().NewValue().Message()
				fill(sub, depth-1)
				v = protoreflect.ValueOfMessage(sub)
			} else {
				v, ok = scalarOf(m, fd.MapValue(), depth)
			}
			if ok {
				m.Mutable(fd).Map().Set(protoreflect.ValueOfString("wal-0/a").MapKey(), v)
			}
		default:
			if v, ok := value(); ok {
				m.Set(fd, v)
			}
		}
	}
}

func scalarOf(m protoreflect.Message, fd protoreflect.FieldDescriptor, depth int) (protoreflect.Value, bool) {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		if depth == 0 {
			return protoreflect.Value{}, false
		}
		if fd.Message().FullName() == "google.protobuf.Timestamp" {
			return protoreflect.ValueOfMessage(at.ProtoReflect()), true
		}
		var sub protoreflect.Message
		if fd.IsList() {
			sub = m.NewField(fd).List().NewElement().Message()
		} else {
			sub = m.NewField(fd).Message()
		}
		fill(sub, depth-1)
		return protoreflect.ValueOfMessage(sub), true
	case protoreflect.EnumKind:
		vs := fd.Enum().Values()
		return protoreflect.ValueOfEnum(vs.Get(vs.Len() - 1).Number()), true
	case protoreflect.StringKind:
		return protoreflect.ValueOfString("TOMBSTONE"), true
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte("payload")), true
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true), true
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(18446744073709551615), true
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(-9007199254740993), true
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(4294967295), true
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(-7), true
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(0.5), true
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(0.5), true
	}
	return protoreflect.Value{}, false
}
