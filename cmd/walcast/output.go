package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
)

// The machine-readable output of every command (-o json, -o yaml, --json)
// follows one set of conventions, documented in docs/cli.md and checked by
// TestJSONConventions and the golden files of testdata/json:
//
//   - an object's keys are snake_case (the API's field names), every field
//     is present: zero numbers, false, "", [] and {} as such, an absent
//     message or time as null;
//   - numbers are JSON numbers, 64-bit ids included (never strings);
//   - enums are lower-case words without their type's prefix
//     ("succeeded", not "OUTCOME_STATUS_SUCCEEDED"), and so are the words
//     the API sends as strings (task states "tombstone", lock modes
//     "exclusive");
//   - times are RFC 3339 strings in UTC with the precision they have
//     ("2026-12-01T10:19:10.123456Z"); durations are Go duration strings
//     ("1m30s");
//   - bytes (payloads) are base64 strings.

// format is how a command prints its result.
type format string

const (
	formatTable format = "table"
	formatWide  format = "wide"
	formatJSON  format = "json"
	formatYAML  format = "yaml"
)

// machine reports whether f is a machine-readable format.
func (f format) machine() bool { return f == formatJSON || f == formatYAML }

// emit prints v (a value of toValue) in the machine format f.
func emit(w io.Writer, f format, v any) error {
	switch f {
	case formatYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return err
		}
		_, err := w.Write(buf.Bytes())
		return err
	}
}

// object is a JSON object of the output.
type object = map[string]any

// protoValue converts a message of the API to the output's conventions.
func protoValue(m proto.Message) object {
	if m == nil {
		return nil
	}
	return messageValue(m.ProtoReflect())
}

// wordFields are string fields of the API that hold enum-like words, with
// their translation (nil: lower-cased).
var wordFields = map[protoreflect.Name]map[string]string{
	"state": nil,
	"role":  nil,
	"stage": nil,
	"mode":  {"R": "shared", "X": "exclusive"},
}

func messageValue(m protoreflect.Message) object {
	out := object{}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := string(fd.Name())
		switch {
		case fd.IsList():
			list := m.Get(fd).List()
			vs := make([]any, list.Len())
			for j := range list.Len() {
				vs[j] = scalarValue(fd, list.Get(j))
			}
			out[name] = vs
		case fd.IsMap():
			mp := m.Get(fd).Map()
			vs := make(object, mp.Len())
			mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				vs[k.String()] = scalarValue(fd.MapValue(), v)
				return true
			})
			out[name] = vs
		case fd.Kind() == protoreflect.MessageKind && !m.Has(fd):
			out[name] = nil
		default:
			out[name] = scalarValue(fd, m.Get(fd))
		}
	}
	return out
}

func scalarValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		switch m := v.Message().Interface().(type) {
		case *timestamppb.Timestamp:
			return timeValue(m)
		case *durationpb.Duration:
			return m.AsDuration().String()
		}
		return messageValue(v.Message())
	case protoreflect.EnumKind:
		return enumWord(fd.Enum(), v.Enum())
	case protoreflect.BytesKind:
		return base64.StdEncoding.EncodeToString(v.Bytes())
	case protoreflect.StringKind:
		s := v.String()
		if tr, ok := wordFields[fd.Name()]; ok && s != "" {
			if w, ok := tr[s]; ok {
				return w
			}
			return strings.ToLower(s)
		}
		return s
	}
	return v.Interface() // bool, ints, uints, floats: JSON numbers
}

// timeValue is a timestamp as RFC 3339 in UTC, nil if unset: absent, or
// the Unix epoch (what an unset persisted time decodes to).
func timeValue(t *timestamppb.Timestamp) any {
	if t == nil || !t.IsValid() || t.AsTime().UnixNano() <= 0 {
		return nil
	}
	return t.AsTime().UTC().Format(time.RFC3339Nano)
}

// goTime is a time as the output writes it, nil if zero.
func goTime(t time.Time) any {
	if t.IsZero() || t.UnixNano() <= 0 {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// enumWord is an enum value as a lower-case word without the enum's
// prefix (OUTCOME_STATUS_SUCCEEDED of OutcomeStatus: "succeeded"); nil for
// the unspecified value 0.
func enumWord(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) any {
	if n == 0 {
		return nil
	}
	ev := ed.Values().ByNumber(n)
	if ev == nil {
		return fmt.Sprint(int32(n))
	}
	return strings.ToLower(strings.TrimPrefix(string(ev.Name()), enumPrefix(ed)))
}

// enumPrefix is the prefix every value of an enum shares by the style
// guide: its name in upper snake case and "_".
func enumPrefix(ed protoreflect.EnumDescriptor) string {
	var b strings.Builder
	for i, r := range string(ed.Name()) {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String()) + "_"
}

// with adds fields to an object (the CLI's own, beside the API's).
func with(o object, kv ...any) object {
	for i := 0; i+1 < len(kv); i += 2 {
		o[kv[i].(string)] = kv[i+1]
	}
	return o
}

// ordered is an object whose keys keep their order in JSON and YAML, where
// an object's keys are otherwise sorted: a list streamed an item at a time
// (listWriter) has its items first and what follows them (the cursor of
// the rest) after, so its gathered document is ordered the same way.
type ordered []field

// field is one key of an ordered object.
type field struct {
	key   string
	value any
}

// MarshalJSON writes the object with its keys in order; HTML characters
// are not escaped, as emit writes them.
func (o ordered) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString(jsonString(f.key) + ":")
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(f.value); err != nil {
			return nil, err
		}
		buf.Truncate(buf.Len() - 1) // the encoder's newline
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// MarshalYAML makes the object a mapping with its keys in order.
func (o ordered) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for _, f := range o {
		var v yaml.Node
		if err := v.Encode(f.value); err != nil {
			return nil, err
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f.key}, &v)
	}
	return n, nil
}

// sortedKeys returns the keys of m, sorted.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// table prints aligned columns.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cols ...string) {
	fmt.Fprintln(t.tw, strings.Join(cols, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// copiesValue is the one JSON shape of "where did the copies land", the
// same in broadcast, tasks show and the metadata commands' output
// (docs/cli.md): one object per target vchannel, sorted by vchannel, every
// field present.
func copiesValue(cs []copyLanding) []object {
	slices.SortFunc(cs, func(a, b copyLanding) int { return strings.Compare(a.vchannel, b.vchannel) })
	out := make([]object, 0, len(cs))
	for _, c := range cs {
		cp := c.cp
		out = append(out, object{"vchannel": c.vchannel, "appended": c.appended, "acked": c.acked,
			"message_id": cp.GetMessageId(), "time_tick": cp.GetTimeTick(), "last_confirmed": cp.GetLastConfirmed()})
	}
	return out
}

// copyLanding is one copy of a broadcast: where it landed, if it did.
type copyLanding struct {
	vchannel        string
	appended, acked bool
	cp              *walcastv1.Checkpoint
}

// taskCopies are the copies of a task.
func taskCopies(t *walcastv1.Task) []object {
	cs := make([]copyLanding, 0, len(t.GetVchannels()))
	for _, v := range t.GetVchannels() {
		cs = append(cs, copyLanding{vchannel: v.GetVchannel(), appended: v.GetAppended(), acked: v.GetAcked(), cp: v.GetCheckpoint()})
	}
	return copiesValue(cs)
}

// taskValue is a task's JSON: the API's Task and its copies.
func taskValue(t *walcastv1.Task) object { return with(protoValue(t), "copies", taskCopies(t)) }
