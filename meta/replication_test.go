package meta

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/server"
)

// normalised drops what only a primary changes outside broadcasts: the
// importer's progress of running jobs (a secondary's importer does not run;
// the end of a job, FinishImport, is replicated).
func normalised(s *snapshot) *snapshot {
	for _, j := range s.Jobs {
		if j.State == walcastv1.ImportJobState_IMPORT_JOB_STATE_RUNNING {
			j.State, j.FilesDone, j.Rows, j.UpdatedAt = walcastv1.ImportJobState_IMPORT_JOB_STATE_PENDING, 0, 0, nil
		}
	}
	return s
}

// TestR8_SecondaryConvergesAndHonoursKeysAfterPromote: west follows east;
// a DDL and import workload on east converges on west (metadata and every
// vchannel view); DDL on west is refused; after east is lost and west is
// force-promoted, an import retried with the key accepted on east returns
// east's original job, and new DDL works on west (SPEC §8, R7.8, R8.4).
func TestR8_SecondaryConvergesAndHonoursKeysAfterPromote(t *testing.T) {
	east := startEnv(t, func(c *server.Config, _ *Config) { c.Cluster.Name = "east" })
	west := startEnv(t, func(c *server.Config, _ *Config) { c.Cluster.Name = "west" })
	ctx := ctxT(t)
	if err := west.b().Follow(ctx, broadcast.ReplicateConfig{Primary: "east",
		Secondaries: []broadcast.SecondaryConfig{{Name: "west", Source: east.p.NATSURL()}}}); err != nil {
		t.Fatal(err)
	}

	must[*walcastv1.CreateDatabaseResponse](t)(east.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "shop"}))
	fields := []*walcastv1.Field{{Name: "pk", Type: "int64"}, {Name: "emb", Type: "float_vector"}}
	for _, name := range []string{"orders", "users", "carts"} {
		must[*walcastv1.CreateCollectionResponse](t)(east.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: name, Shards: 2, Fields: fields}))
	}
	must[*walcastv1.CreateIndexResponse](t)(east.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: "orders", Name: "emb_idx", Field: "emb", IndexType: "HNSW"}))
	must[*walcastv1.CreateUserResponse](t)(east.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "alice"}))
	must[*walcastv1.GrantPrivilegeResponse](t)(east.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "alice", Database: "shop", Collection: "orders", Privilege: "Insert"}}))
	must[*walcastv1.RenameCollectionResponse](t)(east.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "shop", OldName: "carts", NewName: "baskets"}))
	dropped := must[*walcastv1.Collection](t)(east.c.DescribeCollection(ctx, "shop", "users"))
	must[*walcastv1.DropCollectionResponse](t)(east.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "shop", Name: "users"}))
	importKey := "bulk-2026-11-29"
	rows := func(n int) string {
		out := "pk,emb\n"
		for i := range n {
			out += fmt.Sprintf("%d,\"[%d, 1]\"\n", i, i)
		}
		return out
	}
	east.writeImport("a.csv", rows(3))
	east.writeImport("b.csv", rows(4))
	orig := must[*walcastv1.ImportResponse](t)(east.c.Import(ctx, &walcastv1.ImportRequest{Database: "shop", Collection: "orders",
		Files: []string{"a.csv", "b.csv"}, IdempotencyKey: importKey}))
	for i := range 3 {
		must[*walcastv1.ImportResponse](t)(east.c.Import(ctx, &walcastv1.ImportRequest{Database: "shop", Collection: "baskets",
			Files: []string{east.writeImport(fmt.Sprintf("f%d.csv", i), rows(i))}, IdempotencyKey: fmt.Sprint("k", i)}))
	}
	east.waitJob(ctx, orig.Job.Id, walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED)

	eventually(t, "west to converge on east's metadata", func() error {
		want := normalised(east.snapshot(ctx))
		got, err := snapshotOf(ctx, west.c)
		if err != nil {
			return err
		}
		if !normalised(got).equal(want) {
			return errors.New("metadata differs")
		}
		return viewsMatch(ctx, west.c, string(west.cfg.ControlChannel()), []*walcastv1.Collection{dropped})
	})
	_, err := west.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "rogue"})
	if !errors.Is(err, client.ErrNotPrimary) {
		t.Fatalf("DDL on the secondary: %v, want not primary", err)
	}

	// East is lost; west is promoted.
	east.stop()
	rc := replicationClient(west)
	if _, err := rc.ForcePromote(ctx, connect.NewRequest(&walcastv1.ForcePromoteRequest{})); err != nil {
		t.Fatal(err)
	}
	retry, err := west.c.Import(ctx, &walcastv1.ImportRequest{Database: "shop", Collection: "orders",
		Files: []string{"a.csv", "b.csv"}, IdempotencyKey: importKey})
	if err != nil {
		t.Fatal(err)
	}
	if !retry.Result.Duplicated || retry.Job.Id != orig.Job.Id || retry.Job.State != walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED ||
		retry.Job.Rows != 7 {
		t.Fatalf("import retried on the promoted cluster: job %v (duplicated %v), want the original %d, completed on east with 7 rows",
			retry.Job, retry.Result.Duplicated, orig.Job.Id)
	}
	must[*walcastv1.CreateDatabaseResponse](t)(west.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "after"}))
	eventually(t, "west's views after the promote", func() error {
		return viewsMatch(ctx, west.c, string(west.cfg.ControlChannel()), []*walcastv1.Collection{dropped})
	})
	if err := west.noAnomalies(); err != nil {
		t.Fatal(err)
	}
}

func replicationClient(e *env) walcastv1connect.ReplicationServiceClient {
	return walcastv1connect.NewReplicationServiceClient(http.DefaultClient, "http://"+e.p.APIAddr())
}
