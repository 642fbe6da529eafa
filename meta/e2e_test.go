package meta

import (
	"slices"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/message"
)

// TestR10_EveryDDLEndToEnd runs every DDL/DCL of the service through the Go
// client against a standalone process, checks the metadata it left, and
// then that every vchannel view of every node equals it (R10.1, R10.2,
// R10.4).
func TestR10_EveryDDLEndToEnd(t *testing.T) {
	e := startEnv(t)
	ctx := ctxT(t)
	c := e.c

	db := must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "shop"}))
	if db.Database.Id == 0 || db.Database.Name != "shop" || db.Result.Duplicated || db.Result.BroadcastId == 0 {
		t.Fatalf("create database: %v", db)
	}
	tmp := must[*walcastv1.CreateDatabaseResponse](t)(c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "scratch"}))

	orders := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{
		Database: "shop", Name: "orders", Shards: 3,
		Fields: []*walcastv1.Field{{Name: "pk", Type: "int64"}, {Name: "emb", Type: "float_vector"}, {Name: "note", Type: "varchar"}}}))
	oc := orders.Collection
	if oc.Id == 0 || oc.DatabaseId != db.Database.Id || oc.Shards != 3 || len(oc.Vchannels) != 3 {
		t.Fatalf("create collection: %v", orders)
	}
	// Shard i of collection id is on pchannel (id+i) mod P.
	ps := e.cfg.PChannelNames()
	for i, v := range oc.Vchannels {
		want := string(ps[(oc.Id+uint64(i))%uint64(len(ps))]) + "/c" + itoa(oc.Id) + "v" + itoa(uint64(i))
		if v != want {
			t.Fatalf("vchannel %d is %s, want %s", i, v, want)
		}
	}
	users := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "users"}))
	if users.Collection.Shards != int32(e.cfg.Meta.CollectionShards) || len(users.Collection.Fields) != 2 {
		t.Fatalf("default shards and schema: %v", users.Collection)
	}
	gone := must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "gone", Shards: 1}))

	idx := must[*walcastv1.CreateIndexResponse](t)(c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: "orders", Name: "by_emb", Field: "emb", IndexType: "HNSW"}))
	if idx.Index.Id == 0 || idx.CollectionId != oc.Id || idx.Index.IndexType != "HNSW" {
		t.Fatalf("create index: %v", idx)
	}
	must[*walcastv1.CreateIndexResponse](t)(c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: "orders", Name: "by_note", Field: "note"}))
	must[*walcastv1.CreateIndexResponse](t)(c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: "users", Name: "by_vec", Field: "vector"}))
	must[*walcastv1.DropIndexResponse](t)(c.DropIndex(ctx, &walcastv1.DropIndexRequest{Database: "shop", Collection: "orders", Name: "by_note"}))
	must[*walcastv1.CreateIndexResponse](t)(c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "shop", Collection: "gone", Name: "doomed", Field: "id"}))

	e.writeImport("orders/a.jsonl", `{"pk": 1, "emb": [0.5, 1], "note": "first"}`+"\n"+`{"pk": 2, "emb": [1, 0], "note": ""}`+"\n")
	e.writeImport("orders/b.csv", "pk,note,emb\n3,third,\"[0, 0]\"\n")
	job := must[*walcastv1.ImportResponse](t)(c.Import(ctx, &walcastv1.ImportRequest{Database: "shop", Collection: "orders", Files: []string{"orders/a.jsonl", "orders/b.csv"}}))
	if job.Job.Id == 0 || job.Job.CollectionId != oc.Id {
		t.Fatalf("import: %v", job)
	}
	must[*walcastv1.ImportResponse](t)(c.Import(ctx, &walcastv1.ImportRequest{Database: "shop", Collection: "users", Files: []string{e.writeImport("u.ndjson", jsonlRows(5))}}))

	ren := must[*walcastv1.RenameCollectionResponse](t)(c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "shop", OldName: "orders", NewName: "purchases"}))
	if ren.Collection.Id != oc.Id || ren.Collection.Name != "purchases" {
		t.Fatalf("rename: %v", ren)
	}
	drop := must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "shop", Name: "gone"}))
	if drop.CollectionId != gone.Collection.Id {
		t.Fatalf("drop collection: %v", drop)
	}
	must[*walcastv1.DropDatabaseResponse](t)(c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: "scratch"}))

	must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "alice"}))
	must[*walcastv1.CreateUserResponse](t)(c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "bob"}))
	must[*walcastv1.GrantPrivilegeResponse](t)(c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "alice", Privilege: "Search", Database: "shop", Collection: "purchases"}}))
	must[*walcastv1.GrantPrivilegeResponse](t)(c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "bob", Privilege: "All", Database: "*"}}))
	must[*walcastv1.GrantPrivilegeResponse](t)(c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{User: "bob", Privilege: "Import", Database: "shop"}}))
	must[*walcastv1.RevokePrivilegeResponse](t)(c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: &walcastv1.Grant{User: "bob", Privilege: "All", Database: "*"}}))

	// The metadata.
	dbs := must[[]*walcastv1.Database](t)(c.ListDatabases(ctx))
	if len(dbs) != 1 || dbs[0].Name != "shop" || dbs[0].Id != db.Database.Id {
		t.Fatalf("databases %v (dropped %v)", dbs, tmp.Database)
	}
	colls := must[[]*walcastv1.Collection](t)(c.ListCollections(ctx, "shop"))
	if len(colls) != 2 || colls[0].Name != "purchases" || colls[0].Id != oc.Id || colls[1].Name != "users" {
		t.Fatalf("collections %v", colls)
	}
	if len(colls[0].Indexes) != 1 || colls[0].Indexes[0].Name != "by_emb" || len(colls[1].Indexes) != 1 {
		t.Fatalf("indexes %v / %v", colls[0].Indexes, colls[1].Indexes)
	}
	desc := must[*walcastv1.Collection](t)(c.DescribeCollection(ctx, "shop", "purchases"))
	if desc.Id != oc.Id || !slices.Equal(desc.Vchannels, oc.Vchannels) {
		t.Fatalf("describe %v", desc)
	}
	us := must[*walcastv1.ListUsersResponse](t)(c.ListUsers(ctx))
	if len(us.Users) != 2 || len(us.Grants) != 2 {
		t.Fatalf("users %v", us)
	}
	jobs := must[[]*walcastv1.ImportJob](t)(c.ListImportJobs(ctx, "shop", "purchases"))
	if len(jobs) != 1 || jobs[0].Id != job.Job.Id || jobs[0].Collection != "purchases" || jobs[0].CollectionId != oc.Id {
		t.Fatalf("jobs of purchases %v", jobs)
	}
	rows := map[uint64]uint64{}
	eventually(t, "import jobs complete", func() error {
		for _, j := range must[[]*walcastv1.ImportJob](t)(c.ListImportJobs(ctx, "", "")) {
			if j.State != walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED {
				return errorf(ErrInvalidArgument, "job %d is %v (%s)", j.Id, j.State, j.Reason)
			}
			rows[j.CollectionId] = j.Rows
		}
		return nil
	})
	if rows[oc.Id] != 3 || rows[users.Collection.Id] != 5 {
		t.Fatalf("rows imported %v", rows)
	}

	// Every node's views equal the metadata once the nodes caught up.
	eventually(t, "views equal the metadata", func() error {
		return e.viewsMatch(ctx, []*walcastv1.Collection{gone.Collection})
	})
	if err := e.noAnomalies(); err != nil {
		t.Fatal(err)
	}
	// The view of a vchannel nobody applied anything to is NotFound.
	_, err := c.GetVChannelView(ctx, string(message.PChannel("wal-1").Control()))
	wantCode(t, err, 5) // NotFound
}

func itoa(v uint64) string { return idStr(v) }

// TestR10_3_BulkImportStoryEndToEnd runs the reference system's BulkImport
// story against a standalone process, on real files in its import root:
// an import keyed by the client completes with its rows counted; a retry
// with the key returns the original job, also by the collection's new name
// after a rename; a retry is answered while max_import_job_num jobs are
// unfinished, where a new import is refused; a failed original stays failed
// for its key; after a drop and recreate, the key makes a new job (R10.3,
// R7.5, R7.9).
func TestR10_3_BulkImportStoryEndToEnd(t *testing.T) {
	e, ctx := importEnv(t, func(c *Config) { c.MaxImportJobNum = 2 })
	c := e.c
	e.writeImport("day1/a.jsonl", jsonlRows(120))
	e.writeImport("day1/b.csv", csvRows(80))
	req := func(coll, key string, files ...string) *walcastv1.ImportRequest {
		return &walcastv1.ImportRequest{Database: "db", Collection: coll, Files: files, IdempotencyKey: key}
	}
	const k = "bulk-day1"
	orig := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c", k, "day1/a.jsonl", "day1/b.csv")))
	e.waitJob(ctx, orig.Job.Id, stateCompleted)
	if j := must[*walcastv1.ImportJob](t)(c.GetImportJob(ctx, orig.Job.Id)); j.Rows != 200 || j.FilesDone != 2 {
		t.Fatalf("job %v, want 200 rows from 2 files", j)
	}
	again := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c", k, "day1/a.jsonl", "day1/b.csv")))
	if !again.Result.Duplicated || again.Job.Id != orig.Job.Id || again.Job.Rows != 200 {
		t.Fatalf("retry %v", again)
	}
	must[*walcastv1.RenameCollectionResponse](t)(c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2"}))
	byNewName := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c2", k, "day1/a.jsonl", "day1/b.csv")))
	if !byNewName.Result.Duplicated || byNewName.Job.Id != orig.Job.Id || byNewName.Job.Collection != "c2" {
		t.Fatalf("retry by the new name %v", byNewName)
	}

	// At the limit: new imports are refused, retries answered.
	e.pauseImporter()
	e.writeImport("day2.jsonl", jsonlRows(10))
	e.writeImport("broken.csv", csvRows(3)+"\"[1, 2, 3]\"\n")
	pending := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c2", "bulk-day2", "day2.jsonl")))
	broken := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c2", "bulk-broken", "broken.csv")))
	_, err := c.Import(ctx, req("c2", "bulk-day3", "day2.jsonl"))
	wantCode(t, err, 8) // ResourceExhausted
	if r := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c2", "bulk-day2", "day2.jsonl"))); !r.Result.Duplicated || r.Job.Id != pending.Job.Id {
		t.Fatalf("retry at the limit %v", r)
	}
	e.svc().importerPaused.Store(false)
	e.waitJob(ctx, pending.Job.Id, stateCompleted)
	e.waitJob(ctx, broken.Job.Id, stateFailed)
	failed := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c2", "bulk-broken", "broken.csv")))
	if !failed.Result.Duplicated || failed.Job.State != stateFailed ||
		failed.Job.Reason != "file broken.csv, line 5: wrong number of values: the header names 2 fields" || failed.Job.Rows != 3 {
		t.Fatalf("retry of the failed job %v", failed)
	}

	// Dropped and recreated: the same key is a new request.
	must[*walcastv1.DropCollectionResponse](t)(c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c2"}))
	must[*walcastv1.CreateCollectionResponse](t)(c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c2"}))
	fresh := must[*walcastv1.ImportResponse](t)(c.Import(ctx, req("c2", k, "day1/a.jsonl", "day1/b.csv")))
	if fresh.Result.Duplicated || fresh.Job.Id == orig.Job.Id {
		t.Fatalf("import after drop and recreate %v", fresh)
	}
	e.waitJob(ctx, fresh.Job.Id, stateCompleted)
	if j := must[*walcastv1.ImportJob](t)(c.GetImportJob(ctx, fresh.Job.Id)); j.Rows != 200 {
		t.Fatalf("new job %v", j)
	}
	// The first job, of the dropped collection, stays completed.
	if j := must[*walcastv1.ImportJob](t)(c.GetImportJob(ctx, orig.Job.Id)); j.State != stateCompleted {
		t.Fatalf("the dropped collection's completed job %v", j)
	}
	if err := e.noAnomalies(); err != nil {
		t.Fatal(err)
	}
}
