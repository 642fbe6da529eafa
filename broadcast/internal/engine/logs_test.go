package engine

import (
	"slices"
	"testing"

	"github.com/walcast/walcast/message"
)

func TestR9_10_TraceAttrsFromTraceparent(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, c := range []struct {
		tp   string
		want []any
	}{
		{"00-" + tid + "-" + sid + "-01", []any{"trace_id", tid, "span_id", sid}},
		{"", nil},
		{"00-" + tid + "-" + sid, nil},         // short
		{"00-" + tid + "X" + sid + "-01", nil}, // bad separator
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + sid + "-01", nil},        // upper case is not W3C
		{"00-00000000000000000000000000000000-" + sid + "-01", nil},        // the invalid trace id
		{"00-" + tid + "-" + sid + "-01\x00", nil},                         // trailing junk
		{"00-<script>alert(1)</script>aaaaaaaaaaaaaa-" + sid + "-01", nil}, // not hex
	} {
		got := TraceAttrs(&message.Message{TraceParent: c.tp})
		if !slices.Equal(got, c.want) {
			t.Errorf("%q: %v, want %v", c.tp, got, c.want)
		}
	}
	if TraceAttrs(nil) != nil {
		t.Error("nil message")
	}
}
