package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// grantPrivileges are the privileges B14's clients grant and revoke in
// turn.
var grantPrivileges = []string{"Insert", "Delete", "Upsert", "Query", "Search", "Import"}

// b14 measures privilege changes per second (a grant, then its revoke)
// from cfg.MetaClients clients, each on a user and a database of its own,
// against two standalones started here: one whose metadata service takes
// the privilege gate and the keys of each change's user and object (what
// walcast does), one whose service takes the one exclusive Privilege key
// for every change (the reference system's, meta.Config.SerialPrivileges),
// in turns (one, fine, fine, one), so that the ratio is the finer keys'
// gain in one run.
func b14(ctx context.Context, cfg Config, t *tracker) (Result, error) {
	dir, err := os.MkdirTemp("", "walcast-bench-grants-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	type side struct {
		p  *server.Process
		cs []*client.Client
	}
	sides := map[bool]*side{}
	for _, serial := range []bool{true, false} {
		t.say(fmt.Sprintf("B14: starting a standalone (%s)", keysName(serial)))
		p, err := startMetaStandalone(ctx, filepath.Join(dir, keysName(serial)), func(c *meta.Config) { c.SerialPrivileges = serial })
		if err != nil {
			return Result{}, err
		}
		defer p.Close()
		cs, closeAll, err := clients([]string{p.APIAddr()}, cfg.MetaClients)
		if err != nil {
			return Result{}, err
		}
		defer closeAll()
		// A user and a database per client.
		for i, c := range cs {
			if _, err := c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: fmt.Sprint("u", i)}); err != nil {
				return Result{}, err
			}
			if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: fmt.Sprint("d", i)}); err != nil {
				return Result{}, err
			}
		}
		sides[serial] = &side{p, cs}
	}
	// op is a client's j-th change: a grant, then its revoke.
	op := func(ctx context.Context, cs []*client.Client, c, j int) error {
		g := &walcastv1.Grant{User: fmt.Sprint("u", c), Privilege: grantPrivileges[(j/2)%len(grantPrivileges)], Database: fmt.Sprint("d", c)}
		var err error
		if j%2 == 0 {
			_, err = cs[c].GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: g})
		} else {
			_, err = cs[c].RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: g})
		}
		return err
	}
	half := cfg.Duration / 2
	rates := map[bool]float64{}
	for i, serial := range []bool{true, false, false, true} {
		s := sides[serial]
		st := t.timed(fmt.Sprintf("B14: grants and revokes, %s, %d clients for %v (phase %d of 4)", keysName(serial), cfg.MetaClients, half, i+1), half)
		// Each phase starts with the privileges not granted: it runs an
		// even number of changes per client.
		n := make([]int, len(s.cs))
		ph, err := measure(ctx, len(s.cs), half, st, func(ctx context.Context, c, j int) error {
			n[c] = j + 1
			return op(ctx, s.cs, c, j)
		})
		st.end()
		if err != nil {
			return Result{}, err
		}
		for c, k := range n { // revoke what the phase left granted
			if k%2 == 1 {
				if err := op(ctx, s.cs, c, k); err != nil {
					return Result{}, err
				}
			}
		}
		rates[serial] += ph.rate / 2
	}
	fine, one := rates[false], rates[true]
	return Result{ID: "B14", Backend: NATS, What: fmt.Sprintf("grants and revokes through the API, %d clients on distinct users and databases", cfg.MetaClients),
		Value: fine, Unit: "changes/s", Floor: one, Ratio: fine / one, Target: ">= 2x the one Privilege key", Pass: fine >= 2*one,
		Note: "floor: the same service holding the one exclusive Privilege key for every change (the reference system's), in turns with it on a standalone of its own"}, nil
}

func keysName(serial bool) string {
	if serial {
		return "one Privilege key"
	}
	return "per-user and per-object keys"
}
