package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	etcdcat "github.com/walcast/walcast/catalog/etcd"
)

// A coordinator's incarnation record: the election lease it campaigns with,
// kept in its state directory (data_dir) so that a coordinator restarted
// after a crash (kill -9, OOM, power loss) recognises its own previous
// incarnation's lease and revokes it instead of waiting up to election.ttl
// for it to expire. Revoking it deletes the dead incarnation's election key:
// the next candidate (the restarted coordinator, or a standby queued
// before it) is elected at once, with a new key and so a new fencing term.
//
// This is safe because the previous incarnation is known to be dead: the
// directory is locked (flock) for the whole life of a coordinator process,
// and the kernel releases the lock only when that process is gone, so a
// coordinator that holds the lock and finds a record knows its writer no
// longer runs. A frozen (SIGSTOP) predecessor still holds the lock: its
// successor refuses to start on the directory rather than take its lease.
// The record names the etcd cluster and election it belongs to, and a lease
// that holds any key outside the election is never revoked
// (etcdcat.RevokeLease), so a data directory reused against another etcd
// cannot revoke someone else's lease.
const (
	incarnationLock   = "coordinator.lock"
	incarnationRecord = "coordinator-lease.json"
)

// ErrStateDirInUse reports a coordinator state directory locked by another
// process (or another coordinator of this one).
var ErrStateDirInUse = errors.New("coordinator state directory in use")

// leaseRecord is what an incarnation writes when it is granted a lease.
type leaseRecord struct {
	ClusterID uint64 `json:"cluster_id"`
	Election  string `json:"election"`
	Lease     int64  `json:"lease"`
	Advertise string `json:"advertise"`
}

// incarnation is a coordinator's hold on its state directory.
type incarnation struct {
	dir  string
	lock *fileutil.LockedFile
	prev *leaseRecord // the previous incarnation's last lease, until taken over
}

// openIncarnation locks dir (created if missing) and reads the previous
// incarnation's record, if any.
func openIncarnation(dir string) (*incarnation, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("coordinator state directory: %w", err)
	}
	lock, err := fileutil.TryLockFile(filepath.Join(dir, incarnationLock), os.O_WRONLY|os.O_CREATE, 0o600)
	if errors.Is(err, fileutil.ErrLocked) {
		return nil, fmt.Errorf("%w: %s (another coordinator or standalone runs on this data_dir; give each its own)", ErrStateDirInUse, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("lock coordinator state directory: %w", err)
	}
	inc := &incarnation{dir: dir, lock: lock}
	b, err := os.ReadFile(filepath.Join(dir, incarnationRecord))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		lock.Close()
		return nil, fmt.Errorf("coordinator state: %w", err)
	default:
		var r leaseRecord
		// A torn or foreign file only costs the fast takeover.
		if json.Unmarshal(b, &r) == nil && r.Lease != 0 {
			inc.prev = &r
		}
	}
	return inc, nil
}

// record saves the lease this incarnation campaigns with, durably (write,
// fsync, rename, fsync the directory): a crash right after must find it.
func (i *incarnation) record(r leaseRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path := filepath.Join(i.dir, incarnationRecord)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	d, err := os.Open(i.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// takeOver revokes the previous incarnation's lease on election if it still
// exists, once: later calls do nothing (the leases recorded since are this
// incarnation's own). It reports whether a lease was revoked.
func (i *incarnation) takeOver(ctx context.Context, client *clientv3.Client, election string, log *slog.Logger) bool {
	prev := i.prev
	if prev == nil {
		return false
	}
	if prev.Election != election {
		i.prev = nil
		return false
	}
	revoked, err := etcdcat.RevokeLease(ctx, client, election, prev.ClusterID, clientv3.LeaseID(prev.Lease))
	if err != nil {
		if errors.Is(err, etcdcat.ErrForeignLease) {
			i.prev = nil
		}
		// Otherwise etcd did not answer: the next campaign tries again.
		log.Warn("could not take over from this coordinator's previous incarnation; its lease expires by itself", "err", err)
		return false
	}
	i.prev = nil
	if revoked {
		log.Info("took over from this coordinator's previous incarnation: revoked its election lease", "lease", fmt.Sprintf("%x", prev.Lease),
			"previous_advertise", prev.Advertise)
	}
	return revoked
}

// close releases the directory.
func (i *incarnation) close() error { return i.lock.Close() }
