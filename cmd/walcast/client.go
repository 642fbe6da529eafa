package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// clientCmds are the broadcast API's commands.
func clientCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{broadcastCmd(g), tasksCmd(g), locksCmd(g), keysCmd(g), replicateCmd(g)}
}

// dial returns a client of --addr and the command's deadline.
func (g *globals) dial(cmd *cobra.Command) (*client.Client, context.Context, context.CancelFunc, error) {
	d, err := time.ParseDuration(g.timeout)
	if err != nil || d <= 0 {
		return nil, nil, nil, usageError{fmt.Errorf("--timeout %q is not a positive duration", g.timeout)}
	}
	opts, err := g.conn.options()
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := client.New(g.conn.addrs(), opts...)
	if err != nil {
		return nil, nil, nil, usageError{err}
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), d)
	return c, ctx, func() { cancel(); c.Close() }, nil
}

// progress prints to stderr how long a call has been waiting, every few
// seconds, so a long wait (a callback retrying, a lock held) is visible.
func progress(cmd *cobra.Command, g *globals, what string) func() {
	if g.json {
		return func() {}
	}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(cmd.ErrOrStderr(), "  ... still waiting for %s (%s)\n", what, time.Since(start).Round(time.Second))
			}
		}
	}()
	return func() { close(done) }
}

// runClient dials --addr, runs call with the client and the command's
// deadline, and prints its result: with --json as JSON (protojson for a
// proto message, encoding/json otherwise), else by human.
func runClient[T any](g *globals, cmd *cobra.Command, call func(context.Context, *client.Client) (T, error),
	human func(io.Writer, T) error) error {
	cl, ctx, done, err := g.dial(cmd)
	if err != nil {
		return err
	}
	defer done()
	res, err := call(ctx, cl)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if g.json {
		if m, ok := any(res).(proto.Message); ok {
			return printProto(w, m)
		}
		return printJSON(w, res)
	}
	return human(w, res)
}

// okResult is the one-line result of a command that changes something.
type okResult struct {
	Result string `json:"result"`
}

// runOK is runClient for a command whose result is one line, which call
// returns: printed as is, or as {"result": line} with --json.
func runOK(g *globals, cmd *cobra.Command, call func(context.Context, *client.Client) (string, error)) error {
	return runClient(g, cmd, func(ctx context.Context, c *client.Client) (okResult, error) {
		line, err := call(ctx, c)
		return okResult{line}, err
	}, func(w io.Writer, r okResult) error {
		_, err := fmt.Fprintln(w, r.Result)
		return err
	})
}

// printProto prints a response as JSON (protojson, field names as in the
// proto).
func printProto(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", UseProtoNames: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func parseScope(s string) (client.Scope, error) {
	switch {
	case s == "":
		return client.Scope{}, nil
	case s == "cluster":
		return client.ClusterScope(), nil
	}
	kind, id, ok := strings.Cut(s, ":")
	n, err := strconv.ParseUint(id, 10, 64)
	if !ok || err != nil {
		return client.Scope{}, fmt.Errorf("--scope %q is not cluster, db:<id> or collection:<id>", s)
	}
	switch kind {
	case "db", "database":
		return client.DatabaseScope(n), nil
	case "coll", "collection":
		return client.CollectionScope(n), nil
	}
	return client.Scope{}, fmt.Errorf("--scope %q is not cluster, db:<id> or collection:<id>", s)
}

func broadcastCmd(g *globals) *cobra.Command {
	var (
		typ, payload, payloadFile, scope, clientKey string
		vchannels, keys                             []string
		syncUp                                      bool
	)
	cmd := &cobra.Command{
		Use:   "broadcast",
		Short: "Broadcast one control message and wait until it took effect",
		Example: `  walcast broadcast --type Generic.v1 --payload hello --vchannel wal-1/c1v0 --vchannel wal-2/c1v1 \
      --key 'Database:db1@R' --key 'Collection:db1:c1@X' --scope collection:1 --client-key import-42`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := message.ParseType(typ)
			if err != nil {
				return usageError{fmt.Errorf("--type: %w", err)}
			}
			body := []byte(payload)
			if payloadFile != "" {
				if body, err = os.ReadFile(payloadFile); err != nil {
					return usageError{err}
				}
			}
			req := &client.BroadcastRequest{Type: t, Payload: body, AckSyncUp: syncUp, ClientKey: clientKey}
			for _, v := range vchannels {
				req.VChannels = append(req.VChannels, message.VChannel(v))
			}
			for _, k := range keys {
				rk, err := resource.Parse(k)
				if err != nil {
					return usageError{fmt.Errorf("--key: %w", err)}
				}
				req.ResourceKeys = append(req.ResourceKeys, rk)
			}
			if req.Scope, err = parseScope(scope); err != nil {
				return usageError{err}
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*broadcastOutput, error) {
				stop := progress(cmd, g, "the broadcast's callback")
				res, err := c.Broadcast(ctx, req)
				stop()
				if err != nil {
					return nil, err
				}
				return newBroadcastOutput(req, res), nil
			}, printBroadcast)
		},
	}
	f := cmd.Flags()
	f.StringVar(&typ, "type", "Generic.v1", "message type <name>.v<version>")
	f.StringVar(&payload, "payload", "", "payload (a string)")
	f.StringVar(&payloadFile, "payload-file", "", "read the payload from a file")
	f.StringArrayVar(&vchannels, "vchannel", nil, "target vchannel <pchannel>/<name> (repeat)")
	f.StringArrayVar(&keys, "key", nil, "resource key <Domain>:<name>@R|X (repeat)")
	f.StringVar(&scope, "scope", "", "idempotency scope: cluster, db:<id> or collection:<id>")
	f.StringVar(&clientKey, "client-key", "", "idempotency client key (minted if --scope is set without it)")
	f.BoolVar(&syncUp, "ack-sync-up", false, "complete only once the streaming nodes acked every copy")
	return cmd
}

// broadcastOutput is what the broadcast command prints; its JSON form is
// the --json output.
type broadcastOutput struct {
	Appends        map[string]appendOutput `json:"appends"`
	Attempts       int                     `json:"attempts"`
	BroadcastID    uint64                  `json:"broadcast_id"`
	ClientKey      string                  `json:"client_key,omitempty"`
	Duplicated     bool                    `json:"duplicated"`
	ExpiresLatest  *time.Time              `json:"expires_latest,omitempty"`
	KeyFingerprint string                  `json:"key_fingerprint,omitempty"`
	Outcome        string                  `json:"outcome"`
}

type appendOutput struct {
	MessageID uint64 `json:"message_id"`
	TimeTick  uint64 `json:"time_tick"`
}

func newBroadcastOutput(req *client.BroadcastRequest, res *client.BroadcastResult) *broadcastOutput {
	out := &broadcastOutput{Appends: make(map[string]appendOutput, len(res.Appends)), Attempts: res.Attempts,
		BroadcastID: res.BroadcastID, Duplicated: res.Duplicated, Outcome: outcomeString(res.Outcome)}
	for v, cp := range res.Appends {
		out.Appends[string(v)] = appendOutput{MessageID: cp.GetMessageId(), TimeTick: cp.GetTimeTick()}
	}
	if res.IdempotencyKey != "" {
		out.KeyFingerprint = res.IdempotencyKey.Fingerprint()
		out.ClientKey = req.ClientKey
		if w := res.Window; w != nil {
			t := w.GetExpiresLatest().AsTime()
			out.ExpiresLatest = &t
		}
	}
	return out
}

func printBroadcast(w io.Writer, o *broadcastOutput) error {
	fmt.Fprintf(w, "broadcast %d", o.BroadcastID)
	if o.Duplicated {
		fmt.Fprint(w, " (duplicate: answered by the original)")
	}
	fmt.Fprintf(w, "  outcome %s\n", o.Outcome)
	if o.KeyFingerprint != "" {
		fmt.Fprintf(w, "idempotency key fingerprint %s, client key %q\n", o.KeyFingerprint, o.ClientKey)
	}
	tb := newTable(w, "VCHANNEL", "MESSAGE ID", "TIME TICK")
	for _, v := range slices.Sorted(maps.Keys(o.Appends)) {
		cp := o.Appends[v]
		tb.row(v, fmt.Sprint(cp.MessageID), fmt.Sprint(cp.TimeTick))
	}
	return tb.flush()
}

func outcomeString(o *walcastv1.Outcome) string {
	if o == nil {
		return "-"
	}
	s := strings.ToLower(strings.TrimPrefix(o.GetStatus().String(), "OUTCOME_STATUS_"))
	if o.GetDetail() != "" {
		s += ": " + o.GetDetail()
	}
	return s
}

func ts(t *timestamppb.Timestamp) string {
	if t == nil || !t.IsValid() || t.AsTime().IsZero() || t.AsTime().Unix() <= 0 {
		return "-"
	}
	return t.AsTime().Local().Format(time.DateTime)
}

func age(t *timestamppb.Timestamp) string {
	if t == nil || t.AsTime().Unix() <= 0 {
		return "-"
	}
	return time.Since(t.AsTime()).Round(time.Second).String()
}

// printTasks prints a task list as a table.
func printTasks(w io.Writer, r *walcastv1.ListTasksResponse) error {
	tb := newTable(w, "ID", "TYPE", "STATE", "AGE", "ACKED", "CALLBACK", "OUTCOME")
	for _, t := range r.GetTasks() {
		acked := 0
		for _, v := range t.GetVchannels() {
			if v.GetAcked() {
				acked++
			}
		}
		cb := "-"
		if c := t.GetCallback(); c.GetAttempts() > 0 {
			cb = fmt.Sprintf("%d attempts", c.GetAttempts())
			if c.GetLastError() != "" && t.GetState() != "TOMBSTONE" {
				cb += ", failing"
			}
		}
		tb.row(fmt.Sprint(t.GetId()), t.GetType(), t.GetState(), age(t.GetCreatedAt()),
			fmt.Sprintf("%d/%d", acked, len(t.GetVchannels())), cb, outcomeString(t.GetOutcome()))
	}
	return tb.flush()
}

// printTask prints one task: its state, callback and vchannels.
func printTask(w io.Writer, t *walcastv1.Task) error {
	fmt.Fprintf(w, "task %d  %s  %s\n", t.GetId(), t.GetType(), t.GetState())
	fmt.Fprintf(w, "created    %s (%s ago)\ncompleted  %s\n", ts(t.GetCreatedAt()), age(t.GetCreatedAt()), ts(t.GetCompletedAt()))
	fmt.Fprintf(w, "keys       %s\n", strings.Join(t.GetResourceKeys(), " "))
	if t.GetKeyFingerprint() != "" {
		fmt.Fprintf(w, "key fp     %s\n", t.GetKeyFingerprint())
	}
	fmt.Fprintf(w, "ack sync   %v\ncommits    %d\n", t.GetAckSyncUp(), t.GetCatalogCommits())
	if t.GetAppendAttempts() > 0 {
		fmt.Fprintf(w, "appends    %d failed rounds, last: %s\n", t.GetAppendAttempts(), t.GetLastAppendError())
	}
	c := t.GetCallback()
	fmt.Fprintf(w, "callback   %d attempts, running %v, last attempt %s, next %s\n", c.GetAttempts(), c.GetRunning(), ts(c.GetLastAttemptAt()), ts(c.GetNextAttemptAt()))
	if c.GetLastError() != "" {
		fmt.Fprintf(w, "last error %s\n", c.GetLastError())
	}
	fmt.Fprintf(w, "outcome    %s\n\n", outcomeString(t.GetOutcome()))
	tb := newTable(w, "VCHANNEL", "APPENDED", "ACKED", "MESSAGE ID", "TIME TICK")
	for _, v := range t.GetVchannels() {
		tb.row(v.GetVchannel(), fmt.Sprint(v.GetAppended()), fmt.Sprint(v.GetAcked()),
			fmt.Sprint(v.GetCheckpoint().GetMessageId()), fmt.Sprint(v.GetCheckpoint().GetTimeTick()))
	}
	return tb.flush()
}

func tasksCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tasks", Short: "List, show, retry or complete broadcast tasks"}
	list := func(use, short string, hanging bool) *cobra.Command {
		var states []string
		var typ string
		var limit int
		var older time.Duration
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if limit < 0 || limit > math.MaxInt32 {
					return usageError{fmt.Errorf("--limit %d is outside 0..%d", limit, math.MaxInt32)}
				}
				req := &walcastv1.ListTasksRequest{Type: typ, Limit: int32(limit)}
				for _, s := range states {
					req.States = append(req.States, strings.ToUpper(s))
				}
				if hanging {
					if older <= 0 {
						return usageError{errors.New("--older-than must be positive")}
					}
					req.States = []string{"PENDING", "REPLICATED"}
				}
				if older > 0 {
					req.OlderThan = durationpb.New(older)
				}
				return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.ListTasksResponse, error) {
					tasks, err := c.ListTasks(ctx, req)
					return &walcastv1.ListTasksResponse{Tasks: tasks}, err
				}, printTasks)
			},
		}
		f := c.Flags()
		if !hanging {
			f.StringSliceVar(&states, "state", nil, "only tasks in these states: pending, replicated, tombstone")
		}
		f.StringVar(&typ, "type", "", "only tasks of this type (<name>.v<version>)")
		f.IntVar(&limit, "limit", 0, "at most this many tasks")
		f.DurationVar(&older, "older-than", 0, "only tasks created longer ago than this")
		return c
	}
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one task: targets, acks, callback attempts and errors, outcome",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.Task, error) {
				return c.GetTask(ctx, id)
			}, printTask)
		},
	}
	retry := &cobra.Command{
		Use:   "retry ID",
		Short: "Make a failing callback retry now instead of after its backoff",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				return fmt.Sprintf("retrying the callback of task %d now", id), c.RetryCallback(ctx, id)
			})
		},
	}
	var reason string
	complete := &cobra.Command{
		Use:   "complete ID --reason TEXT",
		Short: "Complete a stuck callback without its effects (the reason is recorded as its outcome)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if strings.TrimSpace(reason) == "" {
				return usageError{errors.New("--reason is required: it becomes the task's recorded outcome")}
			}
			return runOK(g, cmd, func(ctx context.Context, c *client.Client) (string, error) {
				return fmt.Sprintf("task %d completed by operator", id), c.CompleteCallback(ctx, id, reason)
			})
		},
	}
	complete.Flags().StringVar(&reason, "reason", "", "why the callback is completed by hand")
	cmd.AddCommand(list("list", "List tasks (filter by state and type)", false),
		list("hanging", "List pending or replicated tasks older than --older-than", true), show, retry, complete)
	return cmd
}

func parseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, usageError{fmt.Errorf("task id %q is not a positive integer", s)}
	}
	return id, nil
}

func locksCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "locks",
		Short: "Show held and awaited resource keys, with owners and ages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.ListLocksResponse, error) {
				locks, err := c.ListLocks(ctx)
				return &walcastv1.ListLocksResponse{Locks: locks}, err
			}, func(w io.Writer, r *walcastv1.ListLocksResponse) error {
				tb := newTable(w, "KEY", "ROLE", "OWNER", "MODE", "FOR")
				for _, l := range r.GetLocks() {
					key := l.GetDomain() + ":" + l.GetName()
					for _, h := range l.GetHolders() {
						tb.row(key, "holder", h.GetOwner(), h.GetMode(), age(h.GetSince()))
					}
					for _, wt := range l.GetWaiters() {
						tb.row(key, "waiter", wt.GetOwner(), wt.GetMode(), age(wt.GetSince()))
					}
				}
				return tb.flush()
			})
		},
	}
}

func keysCmd(g *globals) *cobra.Command {
	var typ, key, scope, clientKey string
	lookup := &cobra.Command{
		Use:   "lookup",
		Short: "Show the original of an idempotency key and how long the key is remembered",
		Example: `  walcast keys lookup --type Import.v1 --key 3:42:import-2026-11-29
  walcast keys lookup --type Import.v1 --scope collection:42 --client-key import-2026-11-29`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := message.ParseType(typ)
			if err != nil {
				return usageError{fmt.Errorf("--type: %w", err)}
			}
			k := message.IdempotencyKey(key)
			if key == "" {
				sc, err := parseScope(scope)
				if err != nil || sc == (client.Scope{}) || clientKey == "" {
					return usageError{errors.New("give --key <domain>:<scope id>:<client key>, or --scope and --client-key")}
				}
				if k, err = message.ScopedKey(sc.Domain, sc.ID, clientKey); err != nil {
					return usageError{err}
				}
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.LookupKeyResponse, error) {
				return c.LookupKey(ctx, t, k)
			}, func(out io.Writer, r *walcastv1.LookupKeyResponse) error {
				w := r.GetWindow()
				fmt.Fprintf(out, "key fingerprint  %s\noriginal         broadcast %d (%s)\noutcome          %s\nfirst seen       %s\ncompleted        %s\nexpires latest   %s\n",
					k.Fingerprint(), r.GetBroadcastId(), r.GetState(), outcomeString(r.GetOutcome()), ts(w.GetFirstSeen()), ts(w.GetCompletedAt()), ts(w.GetExpiresLatest()))
				if h := w.GetCountHeadroom(); h >= 0 {
					fmt.Fprintf(out, "count headroom   %d more tombstones before max_count evicts it\n", h)
				}
				return nil
			})
		},
	}
	f := lookup.Flags()
	f.StringVar(&typ, "type", "", "message type <name>.v<version>")
	f.StringVar(&key, "key", "", "scoped key <domain>:<scope id>:<client key>")
	f.StringVar(&scope, "scope", "", "or: scope cluster, db:<id> or collection:<id> ...")
	f.StringVar(&clientKey, "client-key", "", "... with the client key")
	cmd := &cobra.Command{Use: "keys", Short: "Inspect idempotency keys"}
	cmd.AddCommand(lookup)
	return cmd
}
