package memory

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	"github.com/walcast/walcast/wal/waltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type backend struct{}

func (backend) Open(_ *testing.T, ps ...message.PChannel) wal.Log { return New(ps...) }
func (backend) Stop(_ *testing.T, l wal.Log)                      { _ = l.Close() }
func (backend) Dedups() bool                                      { return true }

func TestConformance(t *testing.T) { waltest.Run(t, backend{}) }

func TestFaults(t *testing.T) {
	l := New("p")
	ctx := context.Background()
	l.FailNext("p", 1, Fault{Fail: true})
	if _, err := l.Append(ctx, "p", "a", []byte("a")); !errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("Fail: %v", err)
	}
	l.FailNext("p", 1, Fault{LoseAnswer: true})
	if _, err := l.Append(ctx, "p", "a", []byte("a")); err == nil || errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("LoseAnswer must be ambiguous: %v", err)
	}
	// The retry of the same entry is deduplicated.
	off, err := l.Append(ctx, "p", "a", []byte("a"))
	if err != nil || off != 0 || len(l.Entries("p")) != 1 {
		t.Fatalf("retry after a lost answer: offset %d, %v, %d entries", off, err, len(l.Entries("p")))
	}
}
