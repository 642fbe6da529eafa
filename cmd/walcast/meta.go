package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/diskspace"
)

// metaCmds are the reference metadata service's commands (package meta).
func metaCmds(g *globals) []*cobra.Command {
	cmds := []*cobra.Command{metaDBCmd(g), metaCollectionCmd(g), metaIndexCmd(g), metaUserCmd(g),
		metaGrantCmd(g, true), metaGrantCmd(g, false), metaImportCmd(g), metaViewCmd(g)}
	// Shell completion: --db completes the server's databases, --collection
	// and a command's COLLECTION argument the collections of its --db, a
	// database command's NAME the databases.
	for _, c := range cmds {
		walk(c, func(c *cobra.Command) {
			if c.Flags().Lookup("db") != nil {
				completeDatabases(c, "db", g)
			}
			if c.Flags().Lookup("collection") != nil {
				completeCollectionFlag(c, "collection", g)
			}
			switch {
			case c.ValidArgsFunction != nil:
			case strings.HasPrefix(c.Use, "drop NAME") && c.Parent() != nil && c.Parent().Name() == "db":
				c.ValidArgsFunction = func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
					if len(args) > 0 {
						return nil, cobra.ShellCompDirectiveNoFileComp
					}
					return g.ask(cmd, databaseNames)
				}
			case strings.Contains(c.Use, " NAME") && c.Parent() != nil && c.Parent().Name() == "collection" && !strings.HasPrefix(c.Use, "create"),
				strings.Contains(c.Use, "COLLECTION") || strings.HasPrefix(c.Use, "rename OLD"):
				c.ValidArgsFunction = completeCollectionArg(g)
			}
		})
	}
	return cmds
}

// runDDL runs a DDL command: as runClient, with the request's idempotency
// key (minted by the client unless --key gave one) in the machine output,
// so a script can retry safely, and in the error after a deadline, with
// what to run. While the call runs it says on stderr why it waits (see
// ddlProgress); a call that goes on after the DDL's answer (import start
// --wait) ends that with stopProgress.
func runDDL(g *globals, cmd *cobra.Command, key *string, call func(context.Context, *client.Client) (proto.Message, error),
	human func(io.Writer, proto.Message) error) error {
	if *key == "" {
		*key = client.NewRequestKey() // minted here so that a hint can name it
	}
	w := ddlWaitOf(cmd, time.Now())
	copies := []object{}
	return runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
		var once sync.Once
		stop := g.progress(cmd, func(pctx context.Context) string { return w.progress(pctx, c) })
		cctx, ccancel := reserveForLookup(ctx)
		m, err := call(context.WithValue(cctx, stopProgressKey{}, func() { once.Do(stop) }), c)
		ccancel()
		once.Do(stop)
		if deadlinePassed(err) {
			err = fmt.Errorf("%w\n%s", err, w.hint(ctx, c, *key))
		}
		if err == nil && g.machine() {
			copies = ddlCopies(ctx, c, m)
		}
		return m, err
	}, human, func(m proto.Message) any { return with(protoValue(m), "idempotency_key", *key, "copies", copies) })
}

// ddlCopies are where the copies of a DDL's broadcast landed (the task of
// its result's broadcast_id), in the JSON shape of copiesValue; none if the
// response names no broadcast or its task cannot be read.
func ddlCopies(ctx context.Context, c *client.Client, m proto.Message) []object {
	rf := m.ProtoReflect().Descriptor().Fields().ByName("result")
	if rf == nil || rf.Message() == nil {
		return []object{}
	}
	res := m.ProtoReflect().Get(rf).Message()
	idf := res.Descriptor().Fields().ByName("broadcast_id")
	if idf == nil || res.Get(idf).Uint() == 0 {
		return []object{}
	}
	t, err := c.GetTask(ctx, res.Get(idf).Uint())
	if err != nil {
		return []object{}
	}
	return taskCopies(t)
}

// stopProgressKey is the context key of runDDL's function that ends its
// progress display.
type stopProgressKey struct{}

// stopProgress ends runDDL's progress display (the DDL was answered).
func stopProgress(ctx context.Context) {
	if stop, ok := ctx.Value(stopProgressKey{}).(func()); ok {
		stop()
	}
}

// ddlTypes are the message types of the metadata service's DDL commands
// (package meta's Type*), by command path.
var ddlTypes = map[string]string{
	"db create": "CreateDatabase.v1", "db drop": "DropDatabase.v1",
	"collection create": "CreateCollection.v1", "collection drop": "DropCollection.v1", "collection rename": "RenameCollection.v1",
	"index create": "CreateIndex.v1", "index drop": "DropIndex.v1",
	"user create": "CreateUser.v1", "grant": "GrantPrivilege.v1", "revoke": "RevokePrivilege.v1",
	"import start": "Import.v1",
}

// ddlWait is what a DDL command knows of the broadcast it waits for: its
// type, the database and collection whose resource keys it takes, and when
// it started.
type ddlWait struct {
	typ      string
	db, coll string
	start    time.Time
}

// ddlWaitOf reads a DDL command's type and objects from its path, its
// --db and its arguments.
func ddlWaitOf(cmd *cobra.Command, start time.Time) ddlWait {
	path := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	w := ddlWait{typ: ddlTypes[path], start: start}
	args := cmd.Flags().Args()
	switch cmd.Parent().Name() {
	case "db":
		if len(args) > 0 {
			w.db = args[0]
		}
	case "collection", "index", "import":
		if f := cmd.Flags().Lookup("db"); f != nil {
			w.db = f.Value.String()
		}
		if len(args) > 0 {
			w.coll = args[0]
		}
	}
	return w
}

// progress says why the DDL still waits: the stage of its task once one
// exists (the newest live task of its type on its objects, created since
// it started), else the resource keys of its database or collection that
// another broadcast holds ("waiting for locks:
// Collection:shop:orders held by broadcast 7 (CreateIndex.v1, exclusive,
// 12s)"); "" when it cannot tell.
func (w ddlWait) progress(ctx context.Context, c *client.Client) string {
	if t, n := w.task(ctx, c); t != nil {
		// A task holds its keys: it waits for no lock.
		s := fmt.Sprintf("broadcast %d: %s", t.GetId(), strings.Join(waitReasons(t), "; "))
		if n > 1 {
			s += fmt.Sprintf(" (the newest of %d live %s tasks on these objects)", n, w.typ)
		}
		return s
	}
	if locks, err := c.ListLocks(ctx); err == nil {
		var held []string
		for _, l := range locks {
			// Waiters or not: between two attempts (each a share of the
			// deadline) the DDL waits in no queue.
			if !w.takes(l) {
				continue
			}
			for _, h := range l.GetHolders() {
				if w.conflicts(l, h.GetMode()) {
					held = append(held, fmt.Sprintf("%s:%s held by %s", l.GetDomain(), l.GetName(), holderString(ctx, c, h)))
				}
			}
		}
		if len(held) > 0 {
			return "waiting for locks: " + strings.Join(held, ", ")
		}
	}
	return ""
}

// takes reports whether the DDL takes a resource key of l's domain and
// name: its database's or its collection's.
func (w ddlWait) takes(l *walcastv1.LockState) bool {
	switch l.GetDomain() {
	case "Database":
		return w.db != "" && l.GetName() == w.db
	case "Collection":
		return w.db != "" && w.coll != "" && l.GetName() == w.db+":"+w.coll
	}
	return false
}

// conflicts reports whether a holder of l in mode ("R" or "X") keeps the
// DDL out: the DDL takes its database's key exclusively for the database
// commands and shared otherwise, its collection's shared for an import and
// exclusively otherwise.
func (w ddlWait) conflicts(l *walcastv1.LockState, mode string) bool {
	if mode == "X" {
		return true
	}
	switch l.GetDomain() {
	case "Database":
		return w.coll == "" // db create, db drop
	case "Collection":
		return w.typ != "Import.v1"
	}
	return false
}

// holderString describes a lock holder: a broadcast with its type, its
// mode and how long it has held the key.
func holderString(ctx context.Context, c *client.Client, h *walcastv1.LockHolder) string {
	what := modeWord(h.GetMode()) + ", " + age(h.GetSince())
	var id uint64
	if _, err := fmt.Sscanf(h.GetOwner(), "broadcast %d", &id); err == nil && id > 0 {
		if t, err := c.GetTask(ctx, id); err == nil {
			what = t.GetType() + ", " + what
		}
	}
	s := fmt.Sprintf("%s (%s)", h.GetOwner(), what)
	if m := importOwner.FindStringSubmatch(h.GetOwner()); m != nil {
		s += fmt.Sprintf(": import job %s holds it until the job ends (walcast import show %s)", m[1], m[1])
	}
	return s
}

// importOwner matches the owner label of an import job's hold on its
// collection ("owner 3 (import/3)").
var importOwner = regexp.MustCompile(`\(import/(\d+)\)$`)

// task returns the newest live task of the DDL's type created since the
// command started (less a few seconds of clock skew), and how many there
// are: its own, unless another client runs the same kind of DDL at once.
func (w ddlWait) task(ctx context.Context, c *client.Client) (*walcastv1.Task, int) {
	if w.typ == "" {
		return nil, 0
	}
	r, err := c.ListTasksPage(ctx, &walcastv1.ListTasksRequest{Type: w.typ, States: []string{"PENDING", "REPLICATED"}, Limit: 20})
	if err != nil {
		return nil, 0
	}
	var newest *walcastv1.Task
	n := 0
	for _, t := range r.GetTasks() {
		if t.GetCreatedAt().AsTime().Before(w.start.Add(-5*time.Second)) || !w.onObjects(t) {
			continue
		}
		if n++; newest == nil || t.GetId() > newest.GetId() {
			newest = t
		}
	}
	return newest, n
}

// onObjects reports whether task t takes a resource key of the DDL's
// database or collection (any task, for a DDL on neither).
func (w ddlWait) onObjects(t *walcastv1.Task) bool {
	if w.db == "" {
		return true
	}
	for _, k := range t.GetResourceKeys() {
		if strings.HasPrefix(k, "Database:"+w.db+"@") || w.coll != "" && strings.HasPrefix(k, "Collection:"+w.db+":"+w.coll+"@") {
			return true
		}
	}
	return false
}

// hint says what to run after the DDL's deadline passed: follow the task
// it probably created, and repeat the command with its key, which is safe
// either way.
func (w ddlWait) hint(ctx context.Context, c *client.Client, key string) string {
	again := fmt.Sprintf("repeat the command with --key %s (the key it used) to retry safely", key)
	if t, n := w.task(ctx, c); t != nil {
		which := "it probably created"
		if n > 1 {
			which = fmt.Sprintf("the newest of %d live %s tasks", n, w.typ)
		}
		return fmt.Sprintf("broadcast %d (%s) is %s: %s; follow it with `walcast tasks show %d --watch`, or %s",
			t.GetId(), which, strings.ToLower(t.GetState()), strings.Join(waitReasons(t), "; "), t.GetId(), again)
	}
	return "whether it was done is unknown: " + again
}

// keyFlag declares --key, the idempotency key of a DDL command.
func keyFlag(cmd *cobra.Command, key *string) {
	cmd.Flags().StringVar(key, "key", "", "idempotency key: repeat the command with the same key to retry it safely (minted if empty)")
}

// dbFlag declares the required --db.
func dbFlag(cmd *cobra.Command, db *string) {
	cmd.Flags().StringVar(db, "db", "", "database name (required)")
	_ = cmd.MarkFlagRequired("db")
}

// ddlLine prints the one-line summary of a DDL and how it was answered.
func ddlLine(w io.Writer, r *walcastv1.DDLResult, format string, args ...any) error {
	s := fmt.Sprintf(format, args...)
	if r.GetDuplicated() {
		s += fmt.Sprintf(" (retry answered by the original, broadcast %d: nothing done again)", r.GetBroadcastId())
	} else {
		s += fmt.Sprintf(" (broadcast %d)", r.GetBroadcastId())
	}
	_, err := fmt.Fprintln(w, s)
	return err
}

func metaDBCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "db", Short: "Create, drop or list databases"}
	var key string
	create := &cobra.Command{
		Use: "create NAME", Short: "Create a database", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: args[0], IdempotencyKey: key})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.CreateDatabaseResponse)
				return ddlLine(w, r.GetResult(), "database %s created, id %d", r.GetDatabase().GetName(), r.GetDatabase().GetId())
			})
		},
	}
	keyFlag(create, &key)
	drop := &cobra.Command{
		Use: "drop NAME", Short: "Drop an empty database", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.DropDatabase(ctx, &walcastv1.DropDatabaseRequest{Name: args[0], IdempotencyKey: key})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.DropDatabaseResponse)
				return ddlLine(w, r.GetResult(), "database %s dropped, id %d", args[0], r.GetDatabaseId())
			})
		},
	}
	keyFlag(drop, &key)
	var pg pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List the databases", Args: cobra.NoArgs, Long: "List the databases, by name." + pageHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return streamList(g, cmd, pg, listing[*walcastv1.Database]{key: "databases", header: []string{"ID", "NAME", "CREATED"},
				row: func(d *walcastv1.Database) []string {
					return []string{fmt.Sprint(d.GetId()), d.GetName(), ts(d.GetCreatedAt())}
				},
				page: func(ctx context.Context, c *client.Client, limit int32, token string) ([]*walcastv1.Database, string, error) {
					r, err := c.ListDatabasesPage(ctx, &walcastv1.ListDatabasesRequest{Limit: limit, PageToken: token})
					return r.GetDatabases(), r.GetNextPageToken(), err
				}})
		},
	}
	pg.add(list, "databases")
	cmd.AddCommand(create, drop, list)
	return cmd
}

// pageFlags are a list command's --limit and --page-token.
type pageFlags struct {
	limit int
	token string
}

// pageHelp is the paging paragraph of a list command's help.
const pageHelp = ` The command fetches page after page (the server
answers at most 1,000 a page) until --limit items or the end, printing each as
it arrives; --page-token starts
after an earlier listing, which --limit cut short: its output ends with the token
("(more: --page-token ...)"; next_page_token in JSON).`

func (p *pageFlags) add(cmd *cobra.Command, what string) {
	cmd.Flags().IntVar(&p.limit, "limit", 0, "at most this many "+what+" (0: all)")
	cmd.Flags().StringVar(&p.token, "page-token", "", "start after an earlier listing (the token it ended with)")
}

func (p *pageFlags) check() error {
	if p.limit < 0 {
		return usageError{fmt.Errorf("--limit %d is negative", p.limit)}
	}
	return nil
}

// morePages ends a list's table, and says how to go on if a limit cut it
// short.
func morePages(w io.Writer, tb *table, next string) error {
	if err := tb.flush(); err != nil {
		return err
	}
	if next != "" {
		_, err := fmt.Fprintf(w, "(more: --page-token %s)\n", next)
		return err
	}
	return nil
}

// parseFields reads --field name:type flags.
func parseFields(specs []string) ([]*walcastv1.Field, error) {
	var out []*walcastv1.Field
	for _, s := range specs {
		name, typ, ok := strings.Cut(s, ":")
		if !ok || name == "" || typ == "" {
			return nil, usageError{fmt.Errorf("--field %q is not <name>:<type>", s)}
		}
		out = append(out, &walcastv1.Field{Name: name, Type: typ})
	}
	return out, nil
}

func fieldsString(fs []*walcastv1.Field) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.GetName() + ":" + f.GetType()
	}
	return strings.Join(parts, ", ")
}

func indexesString(is []*walcastv1.Index) string {
	if len(is) == 0 {
		return "-"
	}
	parts := make([]string, len(is))
	for i, x := range is {
		parts[i] = fmt.Sprintf("%s(%s %s)", x.GetName(), x.GetField(), x.GetIndexType())
	}
	return strings.Join(parts, ", ")
}

func metaCollectionCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "collection", Aliases: []string{"coll"}, Short: "Create, drop, rename, list or describe collections"}
	var (
		db, key string
		shards  int32
		fields  []string
		noWait  bool
	)
	create := &cobra.Command{
		Use: "create NAME", Short: "Create a collection: one vchannel per shard, spread over the pchannels", Args: cobra.ExactArgs(1),
		Example: "  walcast collection create orders --db shop --shards 4 --field id:int64 --field emb:float_vector",
		RunE: func(cmd *cobra.Command, args []string) error {
			fs, err := parseFields(fields)
			if err != nil {
				return err
			}
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: db, Name: args[0], Shards: shards,
					Fields: fs, IdempotencyKey: key})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.CreateCollectionResponse)
				cl := r.GetCollection()
				return ddlLine(w, r.GetResult(), "collection %s.%s created, id %d, vchannels %s", cl.GetDatabase(), cl.GetName(),
					cl.GetId(), strings.Join(cl.GetVchannels(), " "))
			})
		},
	}
	dbFlag(create, &db)
	keyFlag(create, &key)
	create.Flags().Int32Var(&shards, "shards", 0, "number of shards (vchannels); 0: the server's meta.collection_shards")
	create.Flags().StringArrayVar(&fields, "field", nil, "a schema field <name>:<type>, repeatable (default id:int64 vector:float_vector)")
	drop := &cobra.Command{
		Use: "drop NAME", Short: "Drop a collection and its indexes", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: db, Name: args[0], IdempotencyKey: key, NoWait: noWait})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.DropCollectionResponse)
				return ddlLine(w, r.GetResult(), "collection %s.%s dropped, id %d", db, args[0], r.GetCollectionId())
			})
		},
	}
	dbFlag(drop, &db)
	keyFlag(drop, &key)
	noWaitFlag(drop, &noWait)
	rename := &cobra.Command{
		Use: "rename OLD NEW", Short: "Rename a collection (it keeps its id)", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: db, OldName: args[0], NewName: args[1],
					IdempotencyKey: key, NoWait: noWait})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.RenameCollectionResponse)
				return ddlLine(w, r.GetResult(), "collection %s.%s renamed to %s, id %d", db, args[0], r.GetCollection().GetName(), r.GetCollection().GetId())
			})
		},
	}
	dbFlag(rename, &db)
	keyFlag(rename, &key)
	noWaitFlag(rename, &noWait)
	var pg pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List the collections of a database", Args: cobra.NoArgs,
		Long: "List the collections of a database, by name." + pageHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return streamList(g, cmd, pg, listing[*walcastv1.Collection]{key: "collections", header: []string{"ID", "NAME", "SHARDS", "INDEXES", "CREATED"},
				row: func(cl *walcastv1.Collection) []string {
					return []string{fmt.Sprint(cl.GetId()), cl.GetName(), fmt.Sprint(cl.GetShards()), indexesString(cl.GetIndexes()), ts(cl.GetCreatedAt())}
				},
				page: func(ctx context.Context, c *client.Client, limit int32, token string) ([]*walcastv1.Collection, string, error) {
					r, err := c.ListCollectionsPage(ctx, &walcastv1.ListCollectionsRequest{Database: db, Limit: limit, PageToken: token})
					return r.GetCollections(), r.GetNextPageToken(), err
				}})
		},
	}
	dbFlag(list, &db)
	pg.add(list, "collections")
	describe := &cobra.Command{
		Use: "describe NAME", Short: "Describe a collection: schema, vchannels, indexes", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.DescribeCollection(ctx, db, args[0])
			}, func(w io.Writer, m proto.Message) error {
				cl := m.(*walcastv1.Collection)
				tb := newTable(w, "FIELD", "VALUE")
				tb.row("id", fmt.Sprint(cl.GetId()))
				tb.row("name", cl.GetName())
				tb.row("database", fmt.Sprintf("%s (id %d)", cl.GetDatabase(), cl.GetDatabaseId()))
				tb.row("shards", fmt.Sprint(cl.GetShards()))
				tb.row("vchannels", strings.Join(cl.GetVchannels(), " "))
				tb.row("schema", fieldsString(cl.GetFields()))
				tb.row("indexes", indexesString(cl.GetIndexes()))
				for _, f := range cl.GetFencedShards() {
					tb.row("fenced shard", fmt.Sprintf("%s split into %s (broadcast %d, fence at %d)", f.GetVchannel(),
						strings.Join(f.GetSplitInto(), " "), f.GetBroadcastId(), f.GetFencePosition()))
				}
				tb.row("created", ts(cl.GetCreatedAt()))
				return tb.flush()
			})
		},
	}
	dbFlag(describe, &db)
	cmd.AddCommand(create, drop, rename, list, describe, splitShardCmd(g))
	return cmd
}

func metaIndexCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "index", Short: "Create or drop indexes"}
	var db, key, field, typ string
	var noWait bool
	create := &cobra.Command{
		Use: "create COLLECTION INDEX", Short: "Create an index on a field", Args: cobra.ExactArgs(2),
		Example: "  walcast index create orders by_emb --db shop --field emb --type HNSW",
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: db, Collection: args[0], Name: args[1],
					Field: field, IndexType: typ, IdempotencyKey: key, NoWait: noWait})
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.CreateIndexResponse)
				return ddlLine(w, r.GetResult(), "index %s (%s on %s) created on %s.%s, id %d", r.GetIndex().GetName(),
					r.GetIndex().GetIndexType(), r.GetIndex().GetField(), db, args[0], r.GetIndex().GetId())
			})
		},
	}
	dbFlag(create, &db)
	keyFlag(create, &key)
	create.Flags().StringVar(&field, "field", "", "the field to index (required)")
	_ = create.MarkFlagRequired("field")
	create.Flags().StringVar(&typ, "type", "", "index type (default AUTOINDEX)")
	noWaitFlag(create, &noWait)
	drop := &cobra.Command{
		Use: "drop COLLECTION INDEX", Short: "Drop an index", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.DropIndex(ctx, &walcastv1.DropIndexRequest{Database: db, Collection: args[0], Name: args[1], IdempotencyKey: key, NoWait: noWait})
			}, func(w io.Writer, m proto.Message) error {
				return ddlLine(w, m.(*walcastv1.DropIndexResponse).GetResult(), "index %s dropped from %s.%s", args[1], db, args[0])
			})
		},
	}
	dbFlag(drop, &db)
	keyFlag(drop, &key)
	noWaitFlag(drop, &noWait)
	cmd.AddCommand(create, drop)
	return cmd
}

func metaUserCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "user", Short: "Create or list users"}
	var key string
	create := &cobra.Command{
		Use: "create NAME", Short: "Create a user", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: args[0], IdempotencyKey: key})
			}, func(w io.Writer, m proto.Message) error {
				return ddlLine(w, m.(*walcastv1.CreateUserResponse).GetResult(), "user %s created", args[0])
			})
		},
	}
	keyFlag(create, &key)
	var pg pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List the users and their grants", Args: cobra.NoArgs,
		Long: "List the users, by name, each with its grants." + pageHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var grants map[string][]*walcastv1.Grant // of the page's users
			return streamList(g, cmd, pg, listing[*walcastv1.User]{key: "users", header: []string{"USER", "CREATED", "GRANTS"},
				row: func(u *walcastv1.User) []string {
					var gs []string
					for _, gr := range grants[u.GetName()] {
						gs = append(gs, fmt.Sprintf("%s on %s.%s", gr.GetPrivilege(), gr.GetDatabase(), gr.GetCollection()))
					}
					return []string{u.GetName(), ts(u.GetCreatedAt()), cmp.Or(strings.Join(gs, ", "), "-")}
				},
				value: func(u *walcastv1.User) any { return userValue(u, grants[u.GetName()]) },
				page: func(ctx context.Context, c *client.Client, limit int32, token string) ([]*walcastv1.User, string, error) {
					r, err := c.ListUsersPage(ctx, &walcastv1.ListUsersRequest{Limit: limit, PageToken: token})
					grants = map[string][]*walcastv1.Grant{}
					for _, gr := range r.GetGrants() {
						grants[gr.GetUser()] = append(grants[gr.GetUser()], gr)
					}
					return r.GetUsers(), r.GetNextPageToken(), err
				}})
		},
	}
	pg.add(list, "users")
	cmd.AddCommand(create, list)
	return cmd
}

// userValue is a user in the document of user list: the user's fields and
// its grants.
func userValue(u *walcastv1.User, grants []*walcastv1.Grant) object {
	gs := make([]any, len(grants))
	for i, gr := range grants {
		gs[i] = protoValue(gr)
	}
	return with(protoValue(u), "grants", gs)
}

// metaGrantCmd is `walcast grant` or `walcast revoke`.
func metaGrantCmd(g *globals, grant bool) *cobra.Command {
	var db, coll, key string
	use, short := "grant USER PRIVILEGE", "Grant a user a privilege on a database or collection"
	if !grant {
		use, short = "revoke USER PRIVILEGE", "Revoke a granted privilege"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Args: cobra.ExactArgs(2),
		Long: short + `. PRIVILEGE is Insert, Delete, Upsert, Query, Search, Import, CreateIndex,
DropIndex, DescribeCollection, CreateDatabase, DropDatabase, CreateCollection,
DropCollection, RenameCollection or All; --db and --collection may be "*" for all.
With authentication on, a writer's metadata DDL needs the matching privilege for
the user named like its token or certificate (admins need none); database-level
privileges (CreateCollection, DropDatabase) need --collection "*", CreateDatabase
needs --db "*".`,
		RunE: func(cmd *cobra.Command, args []string) error {
			gr := &walcastv1.Grant{User: args[0], Privilege: args[1], Database: db, Collection: coll}
			return runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				if grant {
					return c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: gr, IdempotencyKey: key})
				}
				return c.RevokePrivilege(ctx, &walcastv1.RevokePrivilegeRequest{Grant: gr, IdempotencyKey: key})
			}, func(w io.Writer, m proto.Message) error {
				if grant {
					r := m.(*walcastv1.GrantPrivilegeResponse)
					return ddlLine(w, r.GetResult(), "granted %s on %s.%s to %s", gr.Privilege, db, r.GetGrant().GetCollection(), gr.User)
				}
				r := m.(*walcastv1.RevokePrivilegeResponse)
				return ddlLine(w, r.GetResult(), "revoked %s on %s.%s from %s", gr.Privilege, db, r.GetGrant().GetCollection(), gr.User)
			})
		},
	}
	dbFlag(cmd, &db)
	cmd.Flags().StringVar(&coll, "collection", "*", `collection name, or "*" for every collection of the database`)
	keyFlag(cmd, &key)
	return cmd
}

func jobState(s walcastv1.ImportJobState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "IMPORT_JOB_STATE_"))
}

// jobEnded reports whether a job reached its end — completed, failed or
// rolled back — or, two-phase, is ready: it then waits for
// `walcast import commit` or `rollback`.
func jobEnded(j *walcastv1.ImportJob) bool {
	switch j.GetState() {
	case walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED, walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED,
		walcastv1.ImportJobState_IMPORT_JOB_STATE_ROLLED_BACK, walcastv1.ImportJobState_IMPORT_JOB_STATE_READY:
		return true
	}
	return false
}

// jobFailed is the error of a job that failed: the command fails (exit 1)
// after printing the job.
func jobFailed(j *walcastv1.ImportJob) error {
	return kindError{"job_failed", fmt.Errorf("import job %d failed: %s", j.GetId(), j.GetReason())}
}

// keyHint says what to do with an import's key: retry safely with it, or,
// when its job failed, mint a new one (a retry gets the failed job, R7.9).
func keyHint(key string, j *walcastv1.ImportJob) string {
	if j.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED {
		return fmt.Sprintf("key: %s (its job failed: a retry with this key returns the failed job; run the command without --key, or with a new key, to import again)", key)
	}
	return fmt.Sprintf("key: %s (repeat with --key %s to retry safely)", key, key)
}

// jobLine is one line of a job's progress: its state, files, rows and bytes,
// a bar while files are imported (by bytes, so that it moves within one
// large file; by files when the size is unknown), and the elapsed time.
func jobLine(j *walcastv1.ImportJob, elapsed time.Duration) string {
	n := len(j.GetFiles())
	s := fmt.Sprintf("import job %d: %s, %d of %d files, %d rows", j.GetId(), jobState(j.GetState()), j.GetFilesDone(), n, j.GetRows())
	if total := j.GetBytesTotal(); total > 0 {
		s += fmt.Sprintf(", %s of %s", diskspace.Bytes(j.GetBytesDone()), diskspace.Bytes(total))
	}
	if j.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_RUNNING && n > 0 {
		if total := j.GetBytesTotal(); total > 0 {
			s += " " + bar(int(j.GetBytesDone()*1000/total), 1000, 20)
		} else {
			s += " " + bar(int(j.GetFilesDone()), n, 20)
		}
	}
	return s + fmt.Sprintf(" (%s)", elapsed.Round(100*time.Millisecond))
}

// waitJob follows job id until it ends or ctx does, showing its progress on
// w (stderr): on a terminal one line redrawn in place, elsewhere a line per
// change (what a script or a test reads). It returns the job as it ended.
func waitJob(ctx context.Context, c *client.Client, id uint64, w io.Writer, quiet bool) (*walcastv1.ImportJob, error) {
	start := time.Now()
	tty := terminal(w)
	last := ""
	every := 200 * time.Millisecond // a job's first steps are quick; then every pollEvery
	for {
		j, err := c.GetImportJob(ctx, id)
		if err != nil {
			if tty && last != "" {
				fmt.Fprintln(w)
			}
			return nil, err
		}
		if !quiet {
			line := jobLine(j, time.Since(start))
			key := strings.TrimSuffix(line, line[strings.LastIndex(line, " ("):]) // without the time
			switch {
			case tty:
				fmt.Fprintf(w, "\r\x1b[2K%s", line)
			case key != last:
				fmt.Fprintln(w, line)
			}
			last = key
		}
		if jobEnded(j) {
			if tty && !quiet {
				fmt.Fprintln(w)
			}
			return j, nil
		}
		select {
		case <-ctx.Done():
			if tty && !quiet {
				fmt.Fprintln(w)
			}
			return nil, kindError{"deadline_exceeded", fmt.Errorf("import job %d is still %s after the deadline (%v)\nfollow it with `walcast import wait %d` (with a longer --timeout)",
				id, jobState(j.GetState()), ctx.Err(), id)}
		case <-time.After(every):
		}
		every = min(2*every, pollEvery)
	}
}

// printJob prints an import job as a field table.
func printJob(w io.Writer, j *walcastv1.ImportJob) error {
	tb := newTable(w, "FIELD", "VALUE")
	tb.row("id", fmt.Sprint(j.GetId()))
	tb.row("state", jobState(j.GetState()))
	if j.GetReason() != "" {
		tb.row("reason", j.GetReason())
	}
	tb.row("collection", fmt.Sprintf("%s (id %d)", j.GetCollection(), j.GetCollectionId()))
	tb.row("database", fmt.Sprintf("%s (id %d)", j.GetDatabase(), j.GetDatabaseId()))
	tb.row("files", strings.Join(j.GetFiles(), " "))
	tb.row("progress", fmt.Sprintf("%d of %d files, %d rows", j.GetFilesDone(), len(j.GetFiles()), j.GetRows()))
	if !j.GetAutoCommit() {
		tb.row("commit", "two-phase: walcast import commit|rollback "+fmt.Sprint(j.GetId()))
	}
	tb.row("created", ts(j.GetCreatedAt()))
	tb.row("updated", ts(j.GetUpdatedAt()))
	return tb.flush()
}

func metaImportCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "import", Short: "Start, wait for, show, list, commit or roll back bulk import jobs"}
	var db, coll, key string
	var wait, autoCommit bool
	start := &cobra.Command{
		Use: "start COLLECTION FILE...", Short: "Start a bulk import job (--wait: and follow it to its end)", Args: cobra.MinimumNArgs(2),
		Long: `Start a bulk import job into a collection. Each FILE is a path relative to the server's
import root (meta.import_root, default <data dir>/imports): JSON lines (.jsonl, .ndjson, one
object per line) or CSV (.csv, a header row naming the fields). The server reads the files,
checks every row against the collection's fields and counts them; a missing or malformed
file fails the job, naming the file and line.

The command mints an idempotency key unless --key gives one, and prints it (its JSON has it
as idempotency_key): repeat the command with --key to retry it safely — the retry returns
the original job (also after the collection was renamed, if you name it by its new name),
never a second one. A retry of a job that failed returns it failed: use a new key to import
again.

--auto-commit=false makes a two-phase import: once its files are read the job is ready,
its rows staged but not visible, and it holds the collection (its drop, rename, index or
split waits) until walcast import commit ID makes them visible or walcast import rollback ID
discards them.

--wait follows the job to its end (or, two-phase, until it is ready), showing its state,
files, rows and elapsed time on stderr (one line per change when stderr is not a
terminal), and exits 1 if it failed.`,
		ValidArgsFunction: completeCollectionArg(g),
		RunE: func(cmd *cobra.Command, args []string) error {
			if key == "" {
				key = client.NewRequestKey()
			}
			req := &walcastv1.ImportRequest{Database: db, Collection: args[0], Files: args[1:], IdempotencyKey: key}
			if cmd.Flags().Changed("auto-commit") {
				req.AutoCommit = &autoCommit
			}
			f, err := g.format()
			if err != nil {
				return err
			}
			var final *walcastv1.ImportJob
			err = runDDL(g, cmd, &key, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				r, err := c.Import(ctx, req)
				stopProgress(ctx) // from here waitJob shows the job's
				if err != nil || !wait {
					return r, err
				}
				if !f.machine() {
					j := r.GetJob()
					if err := ddlLine(cmd.OutOrStdout(), r.GetResult(), "import job %d into %s.%s: %s", j.GetId(), db, args[0], jobState(j.GetState())); err != nil {
						return nil, err
					}
				}
				if final, err = waitJob(ctx, c, r.GetJob().GetId(), cmd.ErrOrStderr(), f.machine()); err != nil {
					return nil, err
				}
				r.Job = final
				return r, nil
			}, func(w io.Writer, m proto.Message) error {
				r := m.(*walcastv1.ImportResponse)
				j := r.GetJob()
				if wait {
					fmt.Fprintf(w, "import job %d %s: %d of %d files, %d rows\n", j.GetId(), jobState(j.GetState()), j.GetFilesDone(), len(j.GetFiles()), j.GetRows())
				} else if err := ddlLine(w, r.GetResult(), "import job %d into %s.%s: %s", j.GetId(), db, args[0], jobState(j.GetState())); err != nil {
					return err
				}
				if j.GetReason() != "" {
					fmt.Fprintf(w, "reason: %s\n", j.GetReason())
				}
				_, err := fmt.Fprintln(w, keyHint(key, j))
				return err
			})
			if err == nil && final.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED {
				return jobFailed(final)
			}
			return err
		},
	}
	dbFlag(start, &db)
	keyFlag(start, &key)
	start.Flags().BoolVar(&wait, "wait", false, "follow the job to its end, or until it is ready to commit (exit 1 if it failed)")
	start.Flags().BoolVar(&autoCommit, "auto-commit", true, "false: a two-phase import, ready once its files are read, ended by walcast import commit or rollback")
	waitCmd := &cobra.Command{
		Use: "wait ID", Short: "Follow an import job to its end, with its progress (exit 1 if it failed)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			f, err := g.format()
			if err != nil {
				return err
			}
			var final *walcastv1.ImportJob
			err = runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				j, err := waitJob(ctx, c, id, cmd.ErrOrStderr(), f.machine())
				final = j
				return j, err
			}, func(w io.Writer, m proto.Message) error { return printJob(w, m.(*walcastv1.ImportJob)) })
			if err == nil && final.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED {
				return jobFailed(final)
			}
			return err
		},
	}
	show := &cobra.Command{
		Use: "show ID", Short: "Show an import job", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				return c.GetImportJob(ctx, id)
			}, func(w io.Writer, m proto.Message) error { return printJob(w, m.(*walcastv1.ImportJob)) })
		},
	}
	var pg pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List import jobs: all, a database's (--db) or a collection's (--db --collection)", Args: cobra.NoArgs,
		Long: "List import jobs, by id: all, a database's (--db) or a collection's (--db --collection)." + pageHelp,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return streamList(g, cmd, pg, listing[*walcastv1.ImportJob]{key: "jobs",
				header: []string{"ID", "COLLECTION", "STATE", "FILES", "ROWS", "UPDATED", "REASON"},
				row: func(j *walcastv1.ImportJob) []string {
					reason := j.GetReason()
					if reason == "" {
						reason = "-"
					}
					return []string{fmt.Sprint(j.GetId()), fmt.Sprintf("%s.%s (%d)", j.GetDatabase(), j.GetCollection(), j.GetCollectionId()),
						jobState(j.GetState()), fmt.Sprintf("%d/%d", j.GetFilesDone(), len(j.GetFiles())), fmt.Sprint(j.GetRows()),
						ts(j.GetUpdatedAt()), reason}
				},
				page: func(ctx context.Context, c *client.Client, limit int32, token string) ([]*walcastv1.ImportJob, string, error) {
					r, err := c.ListImportJobsPage(ctx, &walcastv1.ListImportJobsRequest{Database: db, Collection: coll, Limit: limit, PageToken: token})
					return r.GetJobs(), r.GetNextPageToken(), err
				}})
		},
	}
	pg.add(list, "jobs")
	list.Flags().StringVar(&db, "db", "", "only jobs of this database")
	list.Flags().StringVar(&coll, "collection", "", "only jobs of this collection (by its current name; needs --db)")
	cmd.AddCommand(start, waitCmd, show, list)
	cmd.AddCommand(importPhaseCmds(g)...)
	return cmd
}

func parseJobID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, usageError{fmt.Errorf("import job id %q is not a positive integer", s)}
	}
	return id, nil
}

func metaViewCmd(g *globals) *cobra.Command {
	var vchannel string
	cmd := &cobra.Command{
		Use:   "view",
		Short: "Show a streaming node's view of a vchannel, built from the messages it applied",
		Long: `Show what the streaming node consuming a vchannel knows of it, built only from the
messages it applied: a shard vchannel's collection, indexes and import jobs; the control
channel's databases, users and grants. The process at --addr must run that node: a
standalone process runs them all; in cluster mode ask the walcast node that consumes the
vchannel's pchannel, at its --metrics-addr (it serves its views there: with its api.auth
settings, or to loopback callers only).`,
		Example: `  walcast view --vchannel wal-1/c12v0
  walcast view --addr 10.0.0.21:7071 --vchannel wal-1/c12v0     # cluster mode: the node consuming wal-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (proto.Message, error) {
				v, err := c.GetVChannelView(ctx, vchannel)
				if errors.Is(err, client.ErrNotFound) {
					err = fmt.Errorf("%w\nin cluster mode the coordinators run no streaming node: ask the node that consumes %s's pchannel, walcast view --addr <its --metrics-addr>", err, vchannel)
				}
				return v, err
			}, func(w io.Writer, m proto.Message) error {
				v := m.(*walcastv1.VChannelView)
				tb := newTable(w, "FIELD", "VALUE")
				tb.row("vchannel", v.GetVchannel())
				tb.row("node", v.GetNode())
				if v.GetCollectionId() != 0 {
					tb.row("collection", fmt.Sprintf("%s (id %d)", v.GetCollection(), v.GetCollectionId()))
					tb.row("database", fmt.Sprintf("%s (id %d)", v.GetDatabase(), v.GetDatabaseId()))
					tb.row("shard", fmt.Sprint(v.GetShard()))
					tb.row("dropped", fmt.Sprint(v.GetDropped()))
					tb.row("indexes", indexesString(v.GetIndexes()))
					jobs := make([]string, len(v.GetImportJobs()))
					for i, j := range v.GetImportJobs() {
						jobs[i] = fmt.Sprint(j)
					}
					tb.row("import jobs", strings.Join(jobs, " "))
					ended := make([]string, len(v.GetFinishedImportJobs()))
					for i, j := range v.GetFinishedImportJobs() {
						ended[i] = fmt.Sprint(j)
					}
					tb.row("finished jobs", strings.Join(ended, " "))
				}
				splitRows(tb, v)
				if len(v.GetDatabases()) > 0 || len(v.GetUsers()) > 0 || len(v.GetGrants()) > 0 {
					dbs := make([]string, len(v.GetDatabases()))
					for i, d := range v.GetDatabases() {
						dbs[i] = fmt.Sprintf("%s(%d)", d.GetName(), d.GetId())
					}
					tb.row("databases", strings.Join(dbs, " "))
					tb.row("users", strings.Join(v.GetUsers(), " "))
					tb.row("grants", fmt.Sprint(len(v.GetGrants())))
				}
				tb.row("applied", fmt.Sprint(v.GetApplied()))
				tb.row("last broadcast", fmt.Sprint(v.GetLastBroadcastId()))
				if len(v.GetAnomalies()) > 0 {
					tb.row("anomalies", strings.Join(v.GetAnomalies(), "; "))
				}
				return tb.flush()
			})
		},
	}
	cmd.Flags().StringVar(&vchannel, "vchannel", "", "the vchannel, <pchannel>/<name> (required)")
	_ = cmd.MarkFlagRequired("vchannel")
	return cmd
}
