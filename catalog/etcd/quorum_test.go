package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/tcpproxy"
	"github.com/walcast/walcast/internal/wait"
)

// quorumClient returns a client of srv through two endpoints, a proxy
// that the test can make hang and the member itself, with the quorum
// options and attempts bounded by attempt.
func quorumClient(t *testing.T, attempt time.Duration) (*clientv3.Client, *tcpproxy.Proxy, clientv3.Config) {
	t.Helper()
	srv := server(t)
	direct := srv.Endpoints()[0]
	p, err := tcpproxy.Start(strings.TrimPrefix(direct, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	cfg := clientv3.Config{Endpoints: []string{"http://" + p.Addr(), direct}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	qc := cfg
	qc.DialOptions = QuorumDialOptions(attempt)
	c, err := clientv3.New(qc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, p, cfg
}

// TestR9_12_HungMemberCostsAnAttempt: one of a client's two endpoints stops
// answering while its connections stay open (a member cut off from its
// peers before it notices, or for good on a one-way cut). Reads,
// transactions, list streams and the election's lease refreshes go on
// through the other: each call that met the hung member costs one bounded
// attempt, and the term outlives several TTLs.
func TestR9_12_HungMemberCostsAnAttempt(t *testing.T) {
	client, p, _ := quorumClient(t, 300*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix, election := uniquePrefixes()
	term := campaign(t, client, election, "a", 2*time.Second)
	defer term.Resign(ctx)
	cat := newCatalog(t, client, Config{Prefix: prefix, Fence: term.Fence(), AttemptTimeout: 300 * time.Millisecond})
	for i := range 4 { // both endpoints in use
		if err := cat.Commit(ctx, catalog.Put("warm/"+string(rune('a'+i)), []byte("v"))); err != nil {
			t.Fatal(err)
		}
	}
	p.Stall()
	start := time.Now()
	for i := range 10 {
		key := "k/" + string(rune('a'+i))
		if err := cat.Commit(ctx, catalog.Put(key, []byte("v"))); err != nil {
			t.Fatalf("commit %d with a hung member: %v", i, err)
		}
		if _, err := cat.Get(ctx, key); err != nil {
			t.Fatalf("get %d with a hung member: %v", i, err)
		}
		n := 0
		if err := cat.List(ctx, "k/", func(string, []byte) error { n++; return nil }); err != nil || n != i+1 {
			t.Fatalf("list %d with a hung member: %d keys, %v", i, n, err)
		}
	}
	// The term's lease is refreshed through the other member: it lasts
	// well past its TTL.
	select {
	case <-term.Done():
		t.Fatalf("the term ended %v after the member hung", time.Since(start))
	case <-time.After(3 * 2 * time.Second):
	}
	if err := cat.Commit(ctx, catalog.Put("after", []byte("v"))); err != nil {
		t.Fatalf("commit after three TTLs: %v", err)
	}
}

// TestR9_12_MembersLeavesAHungMember: the members watcher leaves a member
// whose reads do not answer, so that calls no longer go there, says why,
// and takes it back once it answers again.
func TestR9_12_MembersLeavesAHungMember(t *testing.T) {
	client, p, cfg := quorumClient(t, time.Second)
	m, err := WatchMembers(client, MembersConfig{Dial: cfg, Interval: 50 * time.Millisecond, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	hung, direct := cfg.Endpoints[0], cfg.Endpoints[1]
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		wait.ForNil(t, what, func() error {
			if cond() {
				return nil
			}
			st, _ := m.Status()
			return fmt.Errorf("endpoints %v, status %+v", client.Endpoints(), st)
		})
	}
	waitFor("both members in use", func() bool { return len(client.Endpoints()) == 2 && strings.HasPrefix(m.Summary(), "2 of 2") })
	p.Stall()
	waitFor("the hung member left", func() bool { return slices.Equal(client.Endpoints(), []string{direct}) })
	if s := m.Summary(); !strings.Contains(s, "1 of 2 members reach a quorum") || !strings.Contains(s, hung+": no answer within 300ms") {
		t.Errorf("summary with a hung member: %q", s)
	}
	p.Heal()
	waitFor("the member taken back", func() bool { return len(client.Endpoints()) == 2 })
	// Nobody answering: every endpoint is kept, to use whichever comes back.
	p.Stall()
	waitFor("the hung member left again", func() bool { return slices.Equal(client.Endpoints(), []string{direct}) })
	p.Heal()
}

// TestR9_12_LateAttemptDoesNotApply: an attempt of a fenced transaction
// that reaches etcd after later transactions (a proposal forwarded across
// a partition, delivered after the heal) fails its compare and changes
// nothing; a retry whose earlier attempt was applied (its answer lost)
// succeeds without applying twice.
func TestR9_12_LateAttemptDoesNotApply(t *testing.T) {
	srv := server(t)
	client := newClient(t, srv)
	ctx := testCtx(t)
	prefix, election := uniquePrefixes()
	term := campaign(t, client, election, "a", 5*time.Second)
	defer term.Resign(ctx)
	f := term.Fence()
	cat := newCatalog(t, client, Config{Prefix: prefix, Fence: f})
	// The first transaction as it goes on the wire, kept to be sent late.
	late := client.Txn(ctx).If(f.compare(), clientv3.Compare(clientv3.ModRevision(f.Key), "=", cat.order)).
		Then(clientv3.OpPut(prefix+"name", "old"), clientv3.OpPut(f.Key, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease()))
	if err := cat.Commit(ctx, catalog.Put("name", []byte("old"))); err != nil {
		t.Fatal(err)
	}
	if err := cat.Commit(ctx, catalog.Put("name", []byte("new"))); err != nil {
		t.Fatal(err)
	}
	resp, err := late.Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("late attempt: succeeded %v, %v", resp != nil && resp.Succeeded, err)
	}
	if v, err := cat.Get(ctx, "name"); err != nil || string(v) != "new" {
		t.Fatalf("after the late attempt: %q, %v", v, err)
	}
	// An attempt of the next transaction is applied, its answer lost: the
	// catalog's retry finds the key moved on, with the term intact.
	before := cat.order
	applied, err := client.Txn(ctx).If(f.compare(), clientv3.Compare(clientv3.ModRevision(f.Key), "=", before)).
		Then(clientv3.OpPut(prefix+"name", "newer"), clientv3.OpPut(f.Key, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease())).Commit()
	if err != nil || !applied.Succeeded {
		t.Fatal(err)
	}
	if err := cat.Commit(ctx, catalog.Put("name", []byte("newer"))); err != nil {
		t.Fatalf("retry of an applied transaction: %v", err)
	}
	if cat.order != applied.Header.Revision {
		t.Fatalf("order %d after the retry, want %d", cat.order, applied.Header.Revision)
	}
	if err := cat.Commit(ctx, catalog.Put("name", []byte("newest"))); err != nil {
		t.Fatal(err)
	}
	// The leader key kept its value and lease.
	if leader, err := Leader(ctx, client, election); err != nil || leader != "a" {
		t.Fatalf("leader: %q, %v", leader, err)
	}
	ttl, err := client.TimeToLive(ctx, term.Lease(), clientv3.WithAttachedKeys())
	if err != nil || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != f.Key {
		t.Fatalf("the term's lease holds %v, %v", ttl, err)
	}
	// A term that ended is still fenced.
	if err := term.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cat.Commit(ctx, catalog.Put("name", []byte("zombie"))); !errors.Is(err, catalog.ErrFenced) {
		t.Fatalf("after the term: %v, want ErrFenced", err)
	}
}
