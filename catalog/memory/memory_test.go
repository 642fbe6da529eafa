package memory

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/catalog/catalogtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type backend struct{}

func (backend) Open(*testing.T) catalog.Catalog { return New() }
func (backend) Fence(_ *testing.T, c catalog.Catalog) catalog.Catalog {
	return c.(*Catalog).Reopen()
}
func (backend) Stop(_ *testing.T, c catalog.Catalog) { c.(*Catalog).Store().Close() }

func TestConformance(t *testing.T) { catalogtest.Run(t, backend{}) }

func TestFaults(t *testing.T) {
	c := New()
	ctx := context.Background()
	c.Store().FailNext(1, Fail)
	if err := c.Commit(ctx, catalog.Put("a", []byte("1"))); !catalog.NotApplied(err) || !errors.Is(err, ErrInjected) {
		t.Fatalf("Fail: %v", err)
	}
	if _, err := c.Get(ctx, "a"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatal("a failed commit was applied")
	}
	c.Store().FailNext(1, LoseAnswer)
	err := c.Commit(ctx, catalog.Put("a", []byte("1")))
	if err == nil || catalog.NotApplied(err) {
		t.Fatalf("LoseAnswer must be ambiguous: %v", err)
	}
	if v, err := c.Get(ctx, "a"); err != nil || string(v) != "1" {
		t.Fatal("LoseAnswer did not apply the commit")
	}
	c.Store().FailNext(1, Hang)
	hctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := c.Commit(hctx, catalog.Put("b", nil)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Hang: %v", err)
	}
	c.Store().SetHook(func(ops []catalog.Op) Fault {
		if ops[0].Key == "hooked" {
			return Fail
		}
		return None
	})
	if err := c.Commit(ctx, catalog.Put("hooked", nil)); !catalog.NotApplied(err) {
		t.Fatalf("hook: %v", err)
	}
	if err := c.Commit(ctx, catalog.Put("other", nil)); err != nil {
		t.Fatal(err)
	}
	if c.Store().Applied() != 2 {
		t.Fatalf("applied %d", c.Store().Applied())
	}
}
