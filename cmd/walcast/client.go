package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
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
	return []*cobra.Command{broadcastCmd(g), tasksCmd(g), txnCmd(g), locksCmd(g), keysCmd(g), replicateCmd(g)}
}

// runClient dials the coordinators, runs call with the client and the
// command's deadline, and prints its result: in a machine format as
// machine(res) (protoValue of a proto message by default), else by human.
func runClient[T any](g *globals, cmd *cobra.Command, call func(context.Context, *client.Client) (T, error),
	human func(io.Writer, T) error, machine ...func(T) any) error {
	f, err := g.format()
	if err != nil {
		return err
	}
	cl, ctx, done, err := g.dial(cmd)
	if err != nil {
		return err
	}
	defer done()
	res, err := call(ctx, cl)
	if err != nil {
		return g.connError(cmd, err)
	}
	w := cmd.OutOrStdout()
	if f.machine() {
		if len(machine) > 0 {
			return emit(w, f, machine[0](res))
		}
		if m, ok := any(res).(proto.Message); ok {
			return emit(w, f, protoValue(m))
		}
		return emit(w, f, res)
	}
	return human(w, res)
}

// runOK is runClient for a command whose result is one line, which call
// returns: printed as is, or as {"result": line} in a machine format.
func runOK(g *globals, cmd *cobra.Command, call func(context.Context, *client.Client) (string, error)) error {
	return runClient(g, cmd, call, func(w io.Writer, line string) error {
		_, err := fmt.Fprintln(w, line)
		return err
	}, func(line string) any { return object{"result": line} })
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
		more                                        broadcastFlags
	)
	cmd := &cobra.Command{
		Use:   "broadcast",
		Short: "Broadcast one control message and wait until it took effect",
		Long: `Broadcast one control message to its vchannels (and the control channel) and wait
until its callback ran. While it waits, it says why on stderr: for the resource keys
held by another broadcast, for acks, for a callback that fails and retries.

With --scope the broadcast is idempotent: the client key (--client-key, or one minted
and printed) makes a repeat of the command an answer from the original, never a second
broadcast. If the deadline (--timeout) passes first, the command says whether a task was
created and what to run next.`,
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
			if len(vchannels) == 0 {
				return usageError{errors.New("--vchannel: give the target vchannels (<pchannel>/<name>, repeat the flag)")}
			}
			for _, v := range vchannels {
				if err := message.VChannel(v).Validate(); err != nil {
					return usageError{fmt.Errorf("--vchannel: %w", err)}
				}
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
			if err := more.apply(req); err != nil {
				return err
			}
			if req.Scope != (client.Scope{}) && req.ClientKey == "" {
				// Minted here, not in the client, so that a hint after a
				// deadline can name it.
				req.ClientKey = client.NewRequestKey()
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*broadcastOutput, error) {
				start := time.Now()
				var seen atomic.Uint64 // the task of an unkeyed broadcast, once seen
				stop := g.progress(cmd, func(pctx context.Context) string { return broadcastProgress(pctx, c, req, start, &seen) })
				// The lookup after an ambiguous answer runs within the
				// command's deadline too: the broadcast leaves it a share.
				bctx, bcancel := reserveForLookup(ctx)
				res, err := c.Broadcast(bctx, req)
				bcancel()
				stop()
				if err != nil {
					return nil, broadcastHint(ctx, c, req, err, seen.Load())
				}
				return newBroadcastOutput(req, res), nil
			}, printBroadcast, (*broadcastOutput).value)
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
	more.add(cmd)
	completeTypes(cmd, "type", g)
	return cmd
}

// broadcastProgress says why a broadcast (started at start) still waits:
// its task's stage if the server knows it (a keyed broadcast, or a holder
// of its keys that is its task by every sign: see sameBroadcast), else the
// resource keys it asked for that another broadcast holds.
func broadcastProgress(ctx context.Context, c *client.Client, req *client.BroadcastRequest, start time.Time, seen *atomic.Uint64) string {
	if req.Scope != (client.Scope{}) {
		if k, err := message.ScopedKey(req.Scope.Domain, req.Scope.ID, req.ClientKey); err == nil {
			if ks, err := c.LookupKey(ctx, req.Type, k); err == nil {
				if t, err := c.GetTask(ctx, ks.GetBroadcastId()); err == nil {
					return fmt.Sprintf("broadcast %d: %s", t.GetId(), strings.Join(waitReasons(t), "; "))
				}
				return fmt.Sprintf("broadcast %d was created", ks.GetBroadcastId())
			}
		}
	}
	locks, err := c.ListLocks(ctx)
	if err != nil {
		return ""
	}
	var held []string
	for _, k := range req.ResourceKeys {
		for _, l := range locks {
			if l.GetDomain() != k.Domain.String() || l.GetName() != k.Name {
				continue
			}
			for _, h := range l.GetHolders() {
				if t := sameBroadcast(ctx, c, req, start, h.GetOwner()); t != nil {
					// It holds its keys itself.
					seen.Store(t.GetId())
					return fmt.Sprintf("broadcast %d: %s", t.GetId(), strings.Join(waitReasons(t), "; "))
				}
				if len(l.GetWaiters()) > 0 && (k.Mode == resource.Exclusive || h.GetMode() == resource.Exclusive.String()) {
					held = append(held, fmt.Sprintf("%s held by %s (%s, %s)", k.Domain.String()+":"+k.Name, h.GetOwner(), modeWord(h.GetMode()), age(h.GetSince())))
				}
			}
		}
	}
	if len(held) > 0 {
		return "waiting for locks: " + strings.Join(held, ", ")
	}
	return ""
}

// sameBroadcast returns the live task of a lock holder ("broadcast 7") if
// it is, by every sign, the task of req, which has no key to look it up
// by: the same type, payload, vchannels and resource keys, created since
// start (less a few seconds of clock skew); nil otherwise.
func sameBroadcast(ctx context.Context, c *client.Client, req *client.BroadcastRequest, start time.Time, owner string) *walcastv1.Task {
	var id uint64
	if req.Scope != (client.Scope{}) {
		return nil // looked up by its key
	}
	if _, err := fmt.Sscanf(owner, "broadcast %d", &id); err != nil || id == 0 {
		return nil
	}
	t, err := c.GetTask(ctx, id)
	if err != nil || t.GetType() != req.Type.String() || !bytes.Equal(t.GetPayload(), req.Payload) ||
		t.GetCreatedAt().AsTime().Before(start.Add(-5*time.Second)) {
		return nil
	}
	targets := map[string]bool{}
	for _, v := range t.GetVchannels() {
		targets[v.GetVchannel()] = true
	}
	for _, v := range req.VChannels {
		if !targets[string(v)] {
			return nil
		}
	}
	keys := map[string]bool{}
	for _, k := range t.GetResourceKeys() {
		keys[k] = true
	}
	for _, k := range req.ResourceKeys {
		if !keys[k.String()] {
			return nil
		}
	}
	return t
}

// reserveForLookup returns a context that ends before ctx, the command's
// (--timeout), by the time a lookup after an ambiguous answer needs: a
// fifth of the time left, between 200 ms and 2 s. The command then ends
// within --timeout, lookup included, instead of overrunning it by the
// lookup's own deadline.
func reserveForLookup(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := min(max(time.Until(d)/5, 200*time.Millisecond), 2*time.Second)
	return context.WithDeadline(ctx, d.Add(-reserve))
}

// deadlinePassed reports whether err is the end of the command's deadline:
// the client's context, or the server's answer that the deadline it was
// sent passed ("broadcast continues in the background").
func deadlinePassed(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || connect.CodeOf(err) == connect.CodeDeadlineExceeded
}

// broadcastHint adds to a broadcast's failure what to run next: after a
// deadline, whether a task was created and how to follow it or retry. ctx
// is the command's: the lookup ends with it (reserveForLookup).
func broadcastHint(ctx context.Context, c *client.Client, req *client.BroadcastRequest, err error, seen uint64) error {
	if errors.Is(err, client.ErrBusy) {
		return busyHint(err)
	}
	if !deadlinePassed(err) {
		return err
	}
	keyed := req.Scope != (client.Scope{})
	switch {
	case !keyed && seen != 0:
		return fmt.Errorf("%w\nbroadcast %d was created (its task has this broadcast's type, payload, vchannels and keys); follow it with `walcast tasks show %d --watch` (repeating the command without --scope would broadcast again)",
			err, seen, seen)
	case !keyed:
		return fmt.Errorf("%w\nwithout --scope it cannot be told whether the broadcast was created: look for it with `walcast tasks list --state pending --type %s`",
			err, req.Type)
	}
	k, kerr := message.ScopedKey(req.Scope.Domain, req.Scope.ID, req.ClientKey)
	if kerr != nil {
		return err
	}
	again := fmt.Sprintf("repeat the command with --client-key %s (the key it used)", req.ClientKey)
	ks, lerr := c.LookupKey(ctx, req.Type, k)
	switch {
	case lerr == nil && ks.GetState() == "PERSISTING":
		return fmt.Errorf("%w\nbroadcast %d is being created (its record is not durable yet): %s to wait for its result",
			err, ks.GetBroadcastId(), again)
	case lerr == nil:
		return fmt.Errorf("%w\nbroadcast %d was created (%s); follow it with `walcast tasks show %d --watch`, or %s to wait for its result",
			err, ks.GetBroadcastId(), strings.ToLower(ks.GetState()), ks.GetBroadcastId(), again)
	case errors.Is(lerr, client.ErrNotFound):
		return fmt.Errorf("%w\nno task was created: %s to retry safely", err, again)
	}
	return fmt.Errorf("%w\nwhether a task was created is unknown (%v): %s, which is safe either way", err, lerr, again)
}

// broadcastOutput is what the broadcast command prints.
type broadcastOutput struct {
	res            *client.BroadcastResult
	clientKey      string
	keyFingerprint string
}

func newBroadcastOutput(req *client.BroadcastRequest, res *client.BroadcastResult) *broadcastOutput {
	out := &broadcastOutput{res: res}
	if res.IdempotencyKey != "" {
		out.keyFingerprint = res.IdempotencyKey.Fingerprint()
		out.clientKey = req.ClientKey
	}
	return out
}

// value is the machine form: the API's BroadcastResponse, the client key
// (to repeat the command safely), the key's fingerprint and the attempts.
func (o *broadcastOutput) value() any {
	r := o.res
	pb := &walcastv1.BroadcastResponse{BroadcastId: r.BroadcastID, Duplicated: r.Duplicated, Outcome: r.Outcome, Window: r.Window,
		Appends: make(map[string]*walcastv1.Checkpoint, len(r.Appends))}
	for v, cp := range r.Appends {
		pb.Appends[string(v)] = cp
	}
	for v, x := range r.Extras {
		if pb.Extras == nil {
			pb.Extras = make(map[string][]byte, len(r.Extras))
		}
		pb.Extras[string(v)] = x
	}
	// The broadcast returned once every copy was appended and acked.
	cs := make([]copyLanding, 0, len(r.Appends))
	for v, cp := range r.Appends {
		cs = append(cs, copyLanding{vchannel: string(v), appended: true, acked: true, cp: cp})
	}
	return with(protoValue(pb), "client_key", o.clientKey, "key_fingerprint", o.keyFingerprint, "attempts", r.Attempts,
		"copies", copiesValue(cs))
}

func printBroadcast(w io.Writer, o *broadcastOutput) error {
	r := o.res
	fmt.Fprintf(w, "broadcast %d", r.BroadcastID)
	if r.Duplicated {
		fmt.Fprint(w, " (duplicate: answered by the original)")
	}
	fmt.Fprintf(w, "  outcome %s\n", outcomeString(r.Outcome))
	if o.keyFingerprint != "" {
		fmt.Fprintf(w, "idempotency key fingerprint %s, client key %q\n", o.keyFingerprint, o.clientKey)
	}
	if r.Outcome.GetStatus() == walcastv1.OutcomeStatus_OUTCOME_STATUS_FAILED && r.Duplicated {
		fmt.Fprintln(w, "the original failed, and a retry with this key always gets it: use a new client key to try again")
	}
	if r.Window != nil {
		warnWindow(w, r.Window)
	}
	tb := newTable(w, "VCHANNEL", "MESSAGE ID", "TIME TICK")
	vs := make([]string, 0, len(r.Appends))
	for v := range r.Appends {
		vs = append(vs, string(v))
	}
	slices.Sort(vs)
	for _, v := range vs {
		cp := r.Appends[message.VChannel(v)]
		tb.row(v, fmt.Sprint(cp.GetMessageId()), fmt.Sprint(cp.GetTimeTick()))
	}
	if err := tb.flush(); err != nil {
		return err
	}
	return printExtras(w, r.Extras)
}

// warnWindow says when a key's window was or may be cut short by its
// retention class's max_count (R6.4).
func warnWindow(out io.Writer, w *walcastv1.Window) {
	if n := w.GetClassEarlyEvicted(); n > 0 {
		fmt.Fprintf(out, "warning: %d tombstones of class %s were evicted by its max_count before their max_lifetime: this key's window may end before %s (raise the class's max_count)\n",
			n, w.GetClass(), ts(w.GetExpiresLatest()))
	}
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

// taskOutcome is a task's outcome as the tables show it: the application's
// verdict when it is a failure the broadcast's outcome does not show.
func taskOutcome(o, app *walcastv1.Outcome) string {
	if app != nil {
		return outcomeString(app) + " (application; broadcast " + outcomeString(o) + ")"
	}
	return outcomeString(o)
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

// modeWord is a lock mode as a word.
func modeWord(m string) string {
	switch m {
	case "R":
		return "shared"
	case "X":
		return "exclusive"
	}
	return m
}

// printTasks prints a task list as a table; wide adds the stage and why a
// live task waits.
func printTasks(w io.Writer, tasks []*walcastv1.Task, wide bool) error {
	tb := newTable(w, taskHeader(wide)...)
	for _, t := range tasks {
		tb.row(taskRow(t, wide)...)
	}
	return tb.flush()
}

// taskHeader is the header of a table of tasks.
func taskHeader(wide bool) []string {
	header := []string{"ID", "TYPE", "STATE", "AGE", "ACKED", "CALLBACK", "OUTCOME"}
	if wide {
		header = append(header, "STAGE", "WAITING FOR")
	}
	return header
}

// taskRow is a task's row in a table of tasks.
func taskRow(t *walcastv1.Task, wide bool) []string {
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
	row := []string{fmt.Sprint(t.GetId()), t.GetType(), t.GetState(), age(t.GetCreatedAt()),
		fmt.Sprintf("%d/%d", acked, len(t.GetVchannels())), cb, taskOutcome(t.GetOutcome(), t.GetApplicationOutcome())}
	if wide {
		why := "-"
		if t.GetState() != "TOMBSTONE" {
			why = strings.Join(waitReasons(t), "; ")
		}
		row = append(row, t.GetStage(), why)
	}
	return row
}

// streamTasks prints tasks list page by page as the pages arrive, until
// limit tasks (0: all) or the end, and the cursor of the rest when limit
// stopped it: a table with its header once, or the document of taskList
// (-o json, -o yaml) an item at a time.
func streamTasks(g *globals, cmd *cobra.Command, req *walcastv1.ListTasksRequest, limit int, f format) error {
	cl, ctx, done, err := g.dial(cmd)
	if err != nil {
		return err
	}
	defer done()
	wide := f == formatWide
	lw := &listWriter{w: cmd.OutOrStdout(), f: f, key: "tasks", header: taskHeader(wide)}
	l := &taskList{oldest: req.GetOldestFirst()}
	seen := 0
	for {
		page := proto.CloneOf(req)
		if limit > 0 {
			page.Limit = int32(min(limit-seen, math.MaxInt32))
		}
		resp, err := cl.ListTasksPage(ctx, page)
		if err != nil {
			return g.connError(cmd, err)
		}
		for _, t := range resp.GetTasks() {
			if err := lw.item(t, taskRow(t, wide)); err != nil {
				return err
			}
			l.cursor = t.GetId()
		}
		if err := lw.flushPage(); err != nil {
			return err
		}
		seen += len(resp.GetTasks())
		l.more = resp.GetMore()
		if !l.more || len(resp.GetTasks()) == 0 || limit > 0 && seen >= limit {
			break
		}
		if req.GetOldestFirst() {
			req.AfterId = l.cursor
		} else {
			req.BeforeId = l.cursor
		}
	}
	more := ""
	if l.more {
		more = fmt.Sprintf("(more tasks: %s %d)\n", l.cursorFlag(), l.cursor)
	}
	return lw.endWith(l.tail(), more)
}

// waitReasons says why a live task waits, from its stage, its copies'
// appended and acked flags and its callback.
func waitReasons(t *walcastv1.Task) []string {
	var unappended, unacked []string
	for _, v := range t.GetVchannels() {
		if !v.GetAppended() {
			unappended = append(unappended, v.GetVchannel())
		}
		if !v.GetAcked() {
			unacked = append(unacked, v.GetVchannel())
		}
	}
	c := t.GetCallback()
	switch t.GetStage() {
	case "persisting":
		return []string{"persisting the task in the catalog"}
	case "appending":
		s := fmt.Sprintf("appending its copies to %s", strings.Join(unappended, ", "))
		if n := t.GetAppendAttempts(); n > 0 {
			s += fmt.Sprintf(" (%d failed rounds, last: %s)", n, t.GetLastAppendError())
		}
		return []string{s}
	case "acking":
		return []string{"acking its copies from their append results"}
	case "collecting":
		return []string{"waiting for acks of its replicated copies from " + strings.Join(unacked, ", ")}
	case "promoting":
		return []string{"waiting for the force promote to finish it"}
	case "queued":
		if len(unacked) > 0 {
			return []string{fmt.Sprintf("waiting for acks from %s (their streaming nodes must consume them; if a consumer is gone: walcast tasks ack %d --vchannel ... --reason ...)",
				strings.Join(unacked, ", "), t.GetId())}
		}
		return []string{"its callback waits for an earlier task with a conflicting key to finish (control-channel order)"}
	case "calling":
		return []string{fmt.Sprintf("callback attempt %d running", c.GetAttempts())}
	case "backoff":
		return []string{fmt.Sprintf("callback attempt %d failed (%s); next attempt %s (walcast tasks retry %d: now; walcast tasks complete %d --reason ...: skip it)",
			c.GetAttempts(), c.GetLastError(), ts(c.GetNextAttemptAt()), t.GetId(), t.GetId())}
	case "tombstoning":
		return []string{"writing its tombstone"}
	case "", "tombstoned":
		return []string{"nothing: finished"}
	}
	return []string{t.GetStage()}
}

// checkpointCols are a copy's message id and time tick, "-" for a copy
// with none (not appended or not acked yet).
func checkpointCols(cp *walcastv1.Checkpoint) (string, string) {
	if cp.GetMessageId() == 0 && cp.GetTimeTick() == 0 {
		return "-", "-"
	}
	return fmt.Sprint(cp.GetMessageId()), fmt.Sprint(cp.GetTimeTick())
}

// printTask prints one task: its state, why it waits, its callback and its
// vchannels.
func printTask(w io.Writer, t *walcastv1.Task) error {
	fmt.Fprintf(w, "task %d  %s  %s\n", t.GetId(), t.GetType(), t.GetState())
	fmt.Fprintf(w, "created    %s (%s ago)\ncompleted  %s\n", ts(t.GetCreatedAt()), age(t.GetCreatedAt()), ts(t.GetCompletedAt()))
	fmt.Fprintf(w, "keys       %s\n", strings.Join(t.GetResourceKeys(), " "))
	if t.GetKeyFingerprint() != "" {
		fmt.Fprintf(w, "key fp     %s\n", t.GetKeyFingerprint())
	}
	commits := "- (a tombstone does not keep the count)"
	if t.GetCatalogCommitsKnown() {
		commits = fmt.Sprint(t.GetCatalogCommits())
	}
	fmt.Fprintf(w, "ack sync   %v\ncommits    %s\n", t.GetAckSyncUp(), commits)
	if t.GetState() != "TOMBSTONE" {
		fmt.Fprintf(w, "stage      %s\n", t.GetStage())
		for _, r := range waitReasons(t) {
			fmt.Fprintf(w, "waiting    %s\n", r)
		}
	}
	if t.GetAppendAttempts() > 0 {
		fmt.Fprintf(w, "appends    %d failed rounds, last: %s\n", t.GetAppendAttempts(), t.GetLastAppendError())
	}
	c := t.GetCallback()
	fmt.Fprintf(w, "callback   %d attempts, running %v, last attempt %s, next %s\n", c.GetAttempts(), c.GetRunning(), ts(c.GetLastAttemptAt()), ts(c.GetNextAttemptAt()))
	if c.GetLastError() != "" {
		fmt.Fprintf(w, "last error %s\n", c.GetLastError())
	}
	fmt.Fprintf(w, "outcome    %s\n", outcomeString(t.GetOutcome()))
	if a := t.GetApplicationOutcome(); a != nil {
		fmt.Fprintf(w, "app outcome %s (a retry with this task's key gets this failed original: mint a new key to try again)\n", outcomeString(a))
	}
	printTaskGroup(w, t)
	fmt.Fprintln(w)
	return printTaskCopies(w, t)
}

// taskList is the result of tasks list: the tasks of every page fetched,
// and the cursor of the next one when --limit stopped it.
type taskList struct {
	tasks  []*walcastv1.Task
	more   bool
	cursor uint64 // the last task's id: the next page's before_id (or after_id, oldest first)
	oldest bool
}

// value is the document of tasks list: the tasks, then whether more follow
// and the cursor of the rest (next_before_id, or next_after_id oldest
// first; null at the end), in that order, so that it is written as the
// pages arrive.
func (l *taskList) value() any {
	tasks := make([]any, len(l.tasks))
	for i, t := range l.tasks {
		tasks[i] = protoValue(t)
	}
	return append(ordered{{"tasks", tasks}}, l.tail()...)
}

// tail is what follows the tasks in the document of tasks list.
func (l *taskList) tail() ordered {
	var next any
	if l.more {
		next = l.cursor
	}
	key := "next_before_id"
	if l.oldest {
		key = "next_after_id"
	}
	return ordered{{"more", l.more}, {key, next}}
}

// cursorFlag is the flag that continues after the cursor.
func (l *taskList) cursorFlag() string {
	if l.oldest {
		return "--after-id"
	}
	return "--before-id"
}

// listTasks fetches tasks page by page (the server caps a page) until
// limit tasks (0: all) or the end.
func listTasks(ctx context.Context, c *client.Client, req *walcastv1.ListTasksRequest, limit int) (*taskList, error) {
	out := &taskList{oldest: req.GetOldestFirst()}
	for {
		page := proto.CloneOf(req)
		if limit > 0 {
			page.Limit = int32(min(limit-len(out.tasks), math.MaxInt32))
		}
		resp, err := c.ListTasksPage(ctx, page)
		if err != nil {
			return nil, err
		}
		out.tasks = append(out.tasks, resp.GetTasks()...)
		if n := len(out.tasks); n > 0 {
			out.cursor = out.tasks[n-1].GetId()
		}
		out.more = resp.GetMore()
		if !out.more || len(resp.GetTasks()) == 0 || limit > 0 && len(out.tasks) >= limit {
			return out, nil
		}
		if req.GetOldestFirst() {
			req.AfterId = out.cursor
		} else {
			req.BeforeId = out.cursor
		}
	}
}

// taskStates are the states --state takes (the API's task states, in
// lower case).
var taskStates = []string{"pending", "replicated", "tombstone"}

func tasksCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tasks", Short: "List, show, follow, retry, ack or complete broadcast tasks"}
	list := func(use, short string, hanging bool) *cobra.Command {
		var states []string
		var typ string
		var limit int
		var older time.Duration
		var before, after uint64
		var oldest, watch bool
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Long: short + `. Tasks come newest first (--oldest-first: oldest first), every one of
them: the command fetches page after page (the server caps a page at 1,000) until
--limit tasks or the end, printing each page as it arrives (-o json and -o yaml
too, an item at a time). --before-id / --after-id start after a cursor, the last id
of an earlier listing (its JSON says next_before_id when --limit cut it short).
--watch lists again every 2 seconds until Ctrl-C.`,
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if limit < 0 {
					return usageError{fmt.Errorf("--limit %d is negative", limit)}
				}
				if typ != "" {
					if _, err := message.ParseType(typ); err != nil {
						return usageError{fmt.Errorf("--type: %w", err)}
					}
				}
				if before > 0 && after > 0 && before <= after+1 {
					return usageError{fmt.Errorf("--before-id %d and --after-id %d leave no id between them", before, after)}
				}
				req := &walcastv1.ListTasksRequest{Type: typ, BeforeId: before, AfterId: after, OldestFirst: oldest}
				for _, s := range states {
					if !slices.Contains(taskStates, strings.ToLower(s)) {
						return usageError{fmt.Errorf("--state %q is not %s", s, strings.Join(taskStates, ", "))}
					}
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
				f, err := g.format()
				if err != nil {
					return err
				}
				fetch := func(ctx context.Context, c *client.Client) (*taskList, error) {
					return listTasks(ctx, c, proto.CloneOf(req), limit)
				}
				human := func(w io.Writer, l *taskList) error {
					if err := printTasks(w, l.tasks, f == formatWide); err != nil {
						return err
					}
					if l.more {
						_, err := fmt.Fprintf(w, "(more tasks: %s %d)\n", l.cursorFlag(), l.cursor)
						return err
					}
					return nil
				}
				if watch {
					return g.watch(cmd, func(ctx context.Context, c *client.Client) (any, bool, error) {
						l, err := fetch(ctx, c)
						return l, false, err
					}, func(w io.Writer, v any) error { return human(w, v.(*taskList)) }, func(v any) any { return v.(*taskList).value() })
				}
				return streamTasks(g, cmd, proto.CloneOf(req), limit, f)
			},
		}
		f := c.Flags()
		if !hanging {
			f.StringSliceVar(&states, "state", nil, "only tasks in these states: "+strings.Join(taskStates, ", "))
			_ = c.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(taskStates, cobra.ShellCompDirectiveNoFileComp))
		}
		f.StringVar(&typ, "type", "", "only tasks of this type (<name>.v<version>)")
		f.IntVar(&limit, "limit", 0, "at most this many tasks (0: all)")
		f.DurationVar(&older, "older-than", 0, "only tasks created longer ago than this")
		f.Uint64Var(&before, "before-id", 0, "only tasks with ids below this (a cursor)")
		f.Uint64Var(&after, "after-id", 0, "only tasks with ids above this (a cursor)")
		f.BoolVar(&oldest, "oldest-first", false, "oldest (lowest id) first")
		f.BoolVar(&watch, "watch", false, "list again every 2 seconds until Ctrl-C")
		completeTypes(c, "type", g)
		return c
	}
	var watchTask bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one task: why it waits, targets, acks, callback attempts and errors, outcome",
		Long: `Show one task: its stage and why a live task waits (for appends, for acks from which
vchannels, for a conflicting task's callback, for callback attempt N), its targets with
their checkpoints, its callback attempts and errors, and its outcome. --watch shows it
again whenever it changes, until it is finished (TOMBSTONE) or Ctrl-C.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTaskIDs(g, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			get := func(ctx context.Context, c *client.Client) (*walcastv1.Task, error) { return c.GetTask(ctx, id) }
			if watchTask {
				return g.watch(cmd, func(ctx context.Context, c *client.Client) (any, bool, error) {
					t, err := get(ctx, c)
					return t, t.GetState() == "TOMBSTONE", err
				}, func(w io.Writer, v any) error { return printTask(w, v.(*walcastv1.Task)) },
					func(v any) any { return taskValue(v.(*walcastv1.Task)) })
			}
			return runClient(g, cmd, get, printTask, func(t *walcastv1.Task) any { return taskValue(t) })
		},
	}
	show.Flags().BoolVar(&watchTask, "watch", false, "show the task again whenever it changes, until it is finished")
	retry := &cobra.Command{
		Use:               "retry ID",
		Short:             "Make a failing callback retry now instead of after its backoff",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTaskIDs(g, true),
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
		Use:               "complete ID --reason TEXT",
		Short:             "Complete a stuck callback without its effects (the reason is recorded as its outcome)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTaskIDs(g, true),
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
	var ackReason string
	var ackVChannels []string
	ack := &cobra.Command{
		Use:   "ack ID --vchannel V... --reason TEXT",
		Short: "Ack a task's copies for a consumer that is gone (admin; audited)",
		Long: `Ack copies of a live task on behalf of their consumer, when the streaming node that
should ack them is gone for good (decommissioned, its vchannel moved): the task then
completes. Each copy must be appended (its append result becomes the ack's checkpoint).
Needs the admin role; the call, with the reason, is written to the audit log.`,
		Example:           "  walcast tasks ack 42 --vchannel wal-1/c7v0 --reason 'node n3 decommissioned, its vchannels dropped'",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeTaskIDs(g, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			if len(ackVChannels) == 0 {
				return usageError{errors.New("--vchannel: name the copies to ack (see walcast tasks show)")}
			}
			if strings.TrimSpace(ackReason) == "" {
				return usageError{errors.New("--reason is required: it is written to the audit log")}
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*walcastv1.Task, error) {
				return c.ForceAck(ctx, id, ackVChannels, ackReason)
			}, func(w io.Writer, t *walcastv1.Task) error {
				fmt.Fprintf(w, "acked %s of task %d for its consumer (the reason is in the audit log)\n", strings.Join(ackVChannels, " "), id)
				fmt.Fprintf(w, "task %d is %s", id, t.GetState())
				if t.GetState() != "TOMBSTONE" {
					fmt.Fprintf(w, ": %s", strings.Join(waitReasons(t), "; "))
				}
				_, err := fmt.Fprintln(w)
				return err
			})
		},
	}
	ack.Flags().StringArrayVar(&ackVChannels, "vchannel", nil, "a copy to ack, by its vchannel (repeat)")
	ack.Flags().StringVar(&ackReason, "reason", "", "why the consumer's ack is given by hand (audited)")
	completeUnacked(ack, "vchannel", g)
	cmd.AddCommand(list("list", "List tasks (filter by state and type)", false),
		list("hanging", "List pending or replicated tasks older than --older-than", true), show, retry, complete, ack, waitAckedCmd(g))
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
				fmt.Fprintf(out, "key fingerprint  %s\noriginal         broadcast %d (%s)\noutcome          %s\n",
					k.Fingerprint(), r.GetBroadcastId(), r.GetState(), outcomeString(r.GetOutcome()))
				failed := r.GetOutcome().GetStatus() == walcastv1.OutcomeStatus_OUTCOME_STATUS_FAILED
				if a := r.GetApplicationOutcome(); a != nil {
					fmt.Fprintf(out, "app outcome      %s\n", outcomeString(a))
					failed = true
				}
				fmt.Fprintf(out, "first seen       %s\ncompleted        %s\nexpires latest   %s\n", ts(w.GetFirstSeen()), ts(w.GetCompletedAt()), ts(w.GetExpiresLatest()))
				if h := w.GetCountHeadroom(); h >= 0 {
					fmt.Fprintf(out, "count headroom   %d more tombstones before max_count evicts it\n", h)
				}
				if failed {
					fmt.Fprintln(out, "the original failed: a retry with this key gets it again; mint a new key to try again")
				}
				if c := w.GetClass(); c != "" {
					fmt.Fprintf(out, "retention class  %s\n", c)
				}
				warnWindow(out, w)
				return nil
			}, func(r *walcastv1.LookupKeyResponse) any {
				return with(protoValue(r), "key_fingerprint", k.Fingerprint())
			})
		},
	}
	f := lookup.Flags()
	f.StringVar(&typ, "type", "", "message type <name>.v<version>")
	f.StringVar(&key, "key", "", "scoped key <domain>:<scope id>:<client key>")
	f.StringVar(&scope, "scope", "", "or: scope cluster, db:<id> or collection:<id> ...")
	f.StringVar(&clientKey, "client-key", "", "... with the client key")
	completeTypes(lookup, "type", g)
	var pg pageFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List the remembered idempotency keys with their originals and windows",
		Long: `List the idempotency keys the coordinator remembers, by their originals'
broadcast ids: each key's message type, scope and fingerprint (keys are never
shown raw), its original broadcast, state and window. A page may hold fewer keys
than asked for when the server passed many broadcasts without keys.` + pageHelp,
		Example: `  walcast keys list --limit 20
  walcast keys list -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return streamList(g, cmd, pg, listing[*walcastv1.KeyEntry]{key: "keys",
				header: []string{"BROADCAST", "TYPE", "SCOPE", "KEY FINGERPRINT", "STATE", "COMPLETED", "EXPIRES LATEST"},
				row: func(k *walcastv1.KeyEntry) []string {
					w := k.GetWindow()
					return []string{fmt.Sprint(k.GetBroadcastId()), k.GetType(), k.GetScope(), k.GetKeyFingerprint(), k.GetState(),
						ts(w.GetCompletedAt()), ts(w.GetExpiresLatest())}
				},
				page: func(ctx context.Context, c *client.Client, limit int32, token string) ([]*walcastv1.KeyEntry, string, error) {
					r, err := c.ListKeysPage(ctx, &walcastv1.ListKeysRequest{Limit: limit, PageToken: token})
					return r.GetKeys(), r.GetNextPageToken(), err
				}})
		},
	}
	pg.add(list, "keys")
	cmd := &cobra.Command{Use: "keys", Short: "Inspect idempotency keys"}
	cmd.AddCommand(lookup, list)
	return cmd
}
