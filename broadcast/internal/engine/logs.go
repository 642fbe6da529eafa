package engine

import (
	"log/slog"

	"github.com/walcast/walcast/message"
)

// TraceAttrs returns the log attributes naming the trace a message carries
// (R9.6, R9.10): trace_id and span_id from its W3C traceparent
// ("00-<32 hex>-<16 hex>-<2 hex>"), none if it carries none or a malformed
// one. Records about a task carry them, so that its log lines join its
// caller's trace like the records logged with a traced context.
func TraceAttrs(m *message.Message) []any {
	if m == nil {
		return nil
	}
	tp := m.TraceParent
	if len(tp) != 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' || !isHex(tp[3:35]) || !isHex(tp[36:52]) ||
		tp[3:35] == "00000000000000000000000000000000" {
		return nil
	}
	return []any{"trace_id", tp[3:35], "span_id", tp[36:52]}
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// taskLog is log for records about t: with t's trace ids (log itself for
// nil).
func taskLog(log *slog.Logger, t *task) *slog.Logger {
	if t == nil {
		return log
	}
	if attrs := TraceAttrs(t.msg); attrs != nil {
		return log.With(attrs...)
	}
	return log
}
