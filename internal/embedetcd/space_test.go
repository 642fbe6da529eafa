package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/internal/longtest"
)

// churnQuota is the small quota the space tests give their member; bbolt
// grows its file 16 MiB at a time.
const churnQuota = 48 << 20

// churnCtx bounds a churn: long enough for a loaded machine, where the
// transactions are slower than the pace.
func churnCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// churn writes about total bytes of history the way the catalog does:
// every key is put once and deleted a little later, so the live data stays
// small and only the history grows. It paces itself at about 25 MB/s, and
// returns the first error.
func churn(ctx context.Context, c *clientv3.Client, total int) error {
	const perTxn, size, live = 25, 4 << 10, 100
	value := strings.Repeat("x", size)
	pace := time.NewTicker(4 * time.Millisecond) // perTxn × size each: 25 MB/s
	defer pace.Stop()
	for i := 0; i*size < total; i += perTxn {
		ops := make([]clientv3.Op, 0, 2*perTxn)
		for k := i; k < i+perTxn; k++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("churn/%08d", k), value))
			if k >= live {
				ops = append(ops, clientv3.OpDelete(fmt.Sprintf("churn/%08d", k-live)))
			}
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("after %d MiB: %w", i*size>>20, err)
		}
		select {
		case <-pace.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// TestHistoryBeyondTheQuotaRaisesNoSpaceWithoutTheGuard is the fault the
// space guard is for, shown on a member without it: an hour's retention of
// history that outgrows the quota fills the database, and etcd refuses
// writes from then on (the catalog would refuse every broadcast).
func TestHistoryBeyondTheQuotaRaisesNoSpaceWithoutTheGuard(t *testing.T) {
	longtest.Require(t)
	_, noSpace, err := churnUnguarded(t, t.TempDir(), churnQuota, 2*churnQuota)
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("churning 2 quotas of values without the guard: %v, want etcd's NOSPACE", err)
	}
	if !noSpace {
		t.Fatal("no alarm raised")
	}
}

// TestSpaceGuardKeepsHistoryUnderTheQuota churns two quotas of values
// (about four of history, each value leaving a revision and a deletion)
// through a member whose retention (an hour) would keep it all: the guard
// compacts the history down to its floor once the file passes half the
// quota, so no write is refused and no alarm is raised.
func TestSpaceGuardKeepsHistoryUnderTheQuota(t *testing.T) {
	longtest.Require(t)
	var compactions atomic.Int64
	s := startT(t, Config{Dir: t.TempDir(), CompactionRetention: time.Hour, QuotaBytes: churnQuota,
		HistoryFloor: 200 * time.Millisecond, guardEvery: 50 * time.Millisecond,
		onGuard: func(action string) {
			if action == "compact" {
				compactions.Add(1)
			}
		}})
	c := client(t, s)
	if err := churn(churnCtx(t), c, 2*churnQuota); err != nil {
		t.Fatalf("churning 2 quotas of values with the guard: %v", err)
	}
	if a := s.etcd.Server.Alarms(); len(a) != 0 {
		t.Fatalf("alarms raised: %v", a)
	}
	if compactions.Load() == 0 {
		t.Fatal("the guard never compacted")
	}
	if size := s.etcd.Server.Backend().Size(); size >= churnQuota {
		t.Fatalf("database file %d bytes, quota %d", size, churnQuota)
	}
	// The newest history, inside the floor, is still there: the latest
	// revision can be read at revision-1.
	resp, err := c.Get(ctx(t), "churn/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx(t), "churn/", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(resp.Header.Revision-1)); err != nil {
		t.Fatalf("reading the history just written: %v", err)
	}
}

// TestSpaceGuardConfig checks the guard's settings.
func TestSpaceGuardConfig(t *testing.T) {
	for _, tc := range []struct {
		in        Config
		quota     int64
		floor     time.Duration
		wantError bool
	}{
		{in: Config{Dir: "d"}, quota: DefaultQuotaBytes, floor: DefaultHistoryFloor},
		{in: Config{Dir: "d", CompactionRetention: 30 * time.Second}, quota: DefaultQuotaBytes, floor: 30 * time.Second},
		{in: Config{Dir: "d", CompactionRetention: -1}, quota: DefaultQuotaBytes, floor: 0},
		{in: Config{Dir: "d", QuotaBytes: 1 << 30, HistoryFloor: -1}, quota: 1 << 30, floor: -1},
		{in: Config{Dir: "d", QuotaBytes: -1}, wantError: true},
	} {
		cfg := tc.in
		err := cfg.fill()
		if tc.wantError {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%+v: %v, want ErrInvalidConfig", tc.in, err)
			}
			continue
		}
		if err != nil || cfg.QuotaBytes != tc.quota || cfg.HistoryFloor != tc.floor {
			t.Errorf("%+v: quota %d floor %v err %v, want %d %v", tc.in, cfg.QuotaBytes, cfg.HistoryFloor, err, tc.quota, tc.floor)
		}
	}
}

// TestSpaceGuardDefragmentsAFileNearTheQuota: a member whose database file
// is already near its quota (history written without the guard, as before
// it existed) gets it compacted and defragmented once the guard runs, so
// the file shrinks to the live data instead of staying a few writes from
// NOSPACE.
func TestSpaceGuardDefragmentsAFileNearTheQuota(t *testing.T) {
	longtest.Require(t)
	const quota = 96 << 20
	dir := t.TempDir()
	before, _, err := churnUnguarded(t, dir, quota, 42<<20) // about 80 MiB of file
	if err != nil {
		t.Fatal(err)
	}
	if before <= quota*8/10 {
		t.Fatalf("setup: the file is %d bytes, not past 80%% of %d", before, quota)
	}
	s, defragged := startGuarded(t, dir, quota, "defrag")
	select {
	case <-defragged:
	case <-ctx(t).Done():
		t.Fatalf("no defragmentation of a %d-byte file (quota %d)", before, quota)
	}
	if after := s.etcd.Server.Backend().Size(); after > quota/2 {
		t.Fatalf("file %d bytes after defragmentation (was %d)", after, before)
	}
	// The live keys are all there.
	resp, err := client(t, s).Get(ctx(t), "churn/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 100 {
		t.Fatalf("live keys after defragmentation: %v, %v (want 100)", resp, err)
	}
}

// TestSpaceGuardDisarmsNoSpace: a member that raised NOSPACE (history
// written without the guard) gets it disarmed once the guard runs and has
// compacted and defragmented: writes are taken again, with no operator.
func TestSpaceGuardDisarmsNoSpace(t *testing.T) {
	dir := t.TempDir()
	_, noSpace, err := churnUnguarded(t, dir, churnQuota, 2*churnQuota)
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("setup: %v, want NOSPACE", err)
	}
	if !noSpace {
		t.Fatal("NoSpace false with the alarm raised")
	}
	s, disarmed := startGuarded(t, dir, churnQuota, "disarm")
	select {
	case <-disarmed:
	case <-ctx(t).Done():
		t.Fatalf("NOSPACE not disarmed: file %d bytes, %d in use, quota %d",
			s.etcd.Server.Backend().Size(), s.etcd.Server.Backend().SizeInUse(), churnQuota)
	}
	if s.NoSpace() {
		t.Fatal("NoSpace true after the guard disarmed it")
	}
	if _, err := client(t, s).Put(ctx(t), "after", "disarm"); err != nil {
		t.Fatalf("a write after the guard disarmed NOSPACE: %v", err)
	}
}

// startGuarded starts a member on dir with an hour's retention, quota and a
// space guard that keeps 10 ms of history and looks every 20 ms; the channel
// hears the guard's first action of that name.
func startGuarded(t *testing.T, dir string, quota int64, action string) (*Server, <-chan struct{}) {
	did := make(chan struct{}, 1)
	s := startT(t, Config{Dir: dir, CompactionRetention: time.Hour, QuotaBytes: quota,
		HistoryFloor: 10 * time.Millisecond, guardEvery: 20 * time.Millisecond,
		onGuard: func(a string) {
			if a == action {
				select {
				case did <- struct{}{}:
				default:
				}
			}
		}})
	return s, did
}

// churnUnguarded churns total bytes of values through a member on dir with
// an hour's retention, quota and no space guard, then closes it. It returns
// the file's size and NoSpace at the end, and the churn's error.
func churnUnguarded(t *testing.T, dir string, quota int64, total int) (size int64, noSpace bool, churnErr error) {
	t.Helper()
	s, err := Start(ctx(t), Config{Dir: dir, CompactionRetention: time.Hour, QuotaBytes: quota, HistoryFloor: -1})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	churnErr = churn(churnCtx(t), c, total)
	c.Close()
	size, noSpace = s.etcd.Server.Backend().Size(), s.NoSpace()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return size, noSpace, churnErr
}
