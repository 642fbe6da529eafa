package metrics

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
)

// TestR9_6_LifecycleLogs: the logging observer writes a debug line for the
// steps the engine's own lines do not cover, and still feeds the metrics it
// wraps.
func TestR9_6_LifecycleLogs(t *testing.T) {
	var buf bytes.Buffer
	m := newBroadcaster()
	o := Logging(m, slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	o.TaskState(typCreate, 0, broadcast.Pending)
	o.Appended(typCreate, 3*time.Millisecond)
	o.Callback(typCreate, time.Millisecond, errors.New("boom"))
	o.Callback(typCreate, time.Millisecond, nil)
	o.TaskState(typCreate, broadcast.Pending, broadcast.Tombstone)
	o.Completed(typCreate, 9*time.Millisecond)
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r["type"] != typCreate.String() {
			t.Errorf("line without the type: %s", line)
		}
		got = append(got, r["level"].(string)+" "+r["msg"].(string))
	}
	want := []string{"DEBUG task appended: every copy is in the WAL", "DEBUG callback attempt failed",
		"DEBUG callback attempt succeeded"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if n := m.taskCount(typCreate, broadcast.Tombstone); n != 1 {
		t.Errorf("the wrapped metrics saw %v tombstones, want 1", n)
	}
	// At info level nothing is written (the engine logs completions).
	buf.Reset()
	o = Logging(m, slog.New(slog.NewJSONHandler(&buf, nil)))
	o.TaskState(typCreate, 0, broadcast.Pending)
	o.Completed(typCreate, time.Millisecond)
	if buf.Len() != 0 {
		t.Errorf("info level wrote: %s", buf.String())
	}
}
