// Package server runs walcast's coordinator: the BroadcastService API over
// the broadcast engine, served over gRPC, gRPC-Web and Connect (JSON over
// HTTP) from one handler (R9.4).
package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/internal/apicodec"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Defaults of the API options.
const (
	// DefaultMaxRequestBytes bounds a request message; it leaves room above
	// the broadcaster's default 256 KiB message limit for targets and keys.
	DefaultMaxRequestBytes = 4 << 20
	// DefaultAckTimeout bounds one Ack on the server side (see
	// WithAckTimeout).
	DefaultAckTimeout = 30 * time.Second
	// DefaultMaxListTasks caps the tasks of one ListTasks page (the
	// response says when more match).
	DefaultMaxListTasks = 1000
	// CompressMinBytes is the smallest response the API's handlers
	// compress (for a client that accepts gzip, as Connect clients do): a
	// broadcast's response is a few hundred bytes, and setting up a gzip
	// writer for each cost 12% of a standalone's CPU under load (B8), to
	// save nothing.
	CompressMinBytes = 4 << 10
)

// Limits of request fields the engine stores whole: larger values are
// refused with code InvalidArgument before anything is done.
const (
	// MaxRequestDigestBytes bounds BroadcastRequest.request_digest, a hash
	// of the client's request (32 bytes for SHA-256).
	MaxRequestDigestBytes = 64
	// MaxReasonBytes bounds CompleteCallbackRequest.reason, which becomes
	// the task's recorded outcome, stored in its tombstone.
	MaxReasonBytes = 1 << 10
	// MaxExtraBytes bounds AckRequest.extra, a consumer's result persisted
	// with its checkpoint in the task's record (R13.12).
	MaxExtraBytes = broadcast.MaxAckExtraBytes
	// MaxRoleBytes bounds a per-target copy's role (R13.10), a short word
	// for the consumer.
	MaxRoleBytes = 64
)

// APIOption configures NewBroadcastHandler.
type APIOption func(*apiConfig)

type apiConfig struct {
	maxRequestBytes int
	ackTimeout      time.Duration
	maxListTasks    int
	logger          *slog.Logger
	connectOpts     []connect.HandlerOption
	reserved        map[message.Type]bool // types only their application's API may broadcast
	judge           app.OutcomeJudge      // the application's verdict on finished tasks; nil: none
	ackSeen         func(node string, a broadcast.Ack)
}

// WithAckSeen makes Ack call f with each ack the broadcaster took and the
// node that sent it (AckRequest.node; without it the caller's identity, or
// its address): the leader's table of what its nodes acked (R9.9). f must
// be fast: it runs on every ack.
func WithAckSeen(f func(node string, a broadcast.Ack)) APIOption {
	return func(c *apiConfig) { c.ackSeen = f }
}

// WithOutcomeJudge makes GetTask, ListTasks and LookupKey report the
// application's outcome of a finished task when it is a failure its
// broadcast's outcome does not show (see app.OutcomeJudge).
func WithOutcomeJudge(j app.OutcomeJudge) APIOption { return func(c *apiConfig) { c.judge = j } }

// judge sets t's application outcome from the judge, if any.
func (a *broadcastAPI) judge(ctx context.Context, b *broadcast.Broadcaster, t *walcastv1.Task, typ message.Type, o broadcast.Outcome) {
	if a.cfg.judge == nil || o.Status == 0 {
		return
	}
	if app, ok := a.cfg.judge.ApplicationOutcome(ctx, b, typ, o); ok {
		t.ApplicationOutcome = outcomePB(app)
	}
}

// WithMaxRequestBytes rejects requests larger than n bytes (on the wire or
// after decompression) with code InvalidArgument, reason
// REQUEST_TOO_LARGE, before they are decoded: a request is at fault, which
// no retry fixes. Default DefaultMaxRequestBytes.
func WithMaxRequestBytes(n int) APIOption { return func(c *apiConfig) { c.maxRequestBytes = n } }

// WithAckTimeout bounds how long the server works on one Ack. An Ack is
// never cancelled by its client (the reference system's bug #45145): it runs
// on a context detached from the request, which only this server-side bound
// ends, so a hung catalog cannot pile up handlers forever. 0 means no bound.
// Default DefaultAckTimeout.
func WithAckTimeout(d time.Duration) APIOption { return func(c *apiConfig) { c.ackTimeout = d } }

// WithMaxListTasks makes a ListTasks page at most n tasks: a request without
// a limit, or with a larger one, gets n, and more set if further tasks
// match. Default DefaultMaxListTasks.
func WithMaxListTasks(n int) APIOption { return func(c *apiConfig) { c.maxListTasks = n } }

// WithAPILogger sets the logger for failures the client cannot act on (code
// Internal). Default slog.Default().
func WithAPILogger(l *slog.Logger) APIOption { return func(c *apiConfig) { c.logger = l } }

// WithReservedTypes makes Broadcast refuse, with code InvalidArgument,
// messages of the types ts that an application owns: their payloads must
// come from the application's own API, which validates them under its locks.
// The built-in AlterReplicateConfig is always refused (ReplicationService
// broadcasts it).
func WithReservedTypes(ts ...message.Type) APIOption {
	return func(c *apiConfig) {
		if c.reserved == nil {
			c.reserved = make(map[message.Type]bool, len(ts))
		}
		for _, t := range ts {
			c.reserved[t] = true
		}
	}
}

// WithConnectOptions passes options (interceptors, compression, ...) to the
// Connect handler.
func WithConnectOptions(opts ...connect.HandlerOption) APIOption {
	return func(c *apiConfig) { c.connectOpts = append(c.connectOpts, opts...) }
}

// NewBroadcastHandler returns the BroadcastService handler over the
// broadcaster l gives while it leads, and the path to mount it on. Every
// error maps to a status code: see codeOf in errors.go. JSON requests with
// unknown fields are refused (strictJSONCodecs).
func NewBroadcastHandler(l app.Leader, opts ...APIOption) (string, http.Handler) {
	cfg := apiConfig{
		maxRequestBytes: DefaultMaxRequestBytes,
		ackTimeout:      DefaultAckTimeout,
		maxListTasks:    DefaultMaxListTasks,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	a := &broadcastAPI{leader: l, cfg: cfg}
	// apicodec.Codec writes a broadcast's answer without protobuf-go's
	// reflection over its maps.
	hopts := append(append([]connect.HandlerOption{connect.WithCodec(apicodec.Codec{}), RequestLimit(cfg.maxRequestBytes), connect.WithCompressMinBytes(CompressMinBytes)},
		strictJSONCodecs()...), cfg.connectOpts...)
	hopts = append(hopts, serverCancels) // innermost: see serverCancels
	path, h := walcastv1connect.NewBroadcastServiceHandler(a, hopts...)
	return path, LimitRequestBytes(h, cfg.maxRequestBytes)
}

// broadcastAPI implements the BroadcastService over the engine.
type broadcastAPI struct {
	leader app.Leader
	cfg    apiConfig
}

var _ walcastv1connect.BroadcastServiceHandler = (*broadcastAPI)(nil)

// fail converts err for the client, logging what only an operator can fix.
func (a *broadcastAPI) fail(procedure string, err error) error {
	return failed(a.cfg.logger, procedure, err)
}

// invalidArg reports a malformed request field.
func invalidArg(format string, args ...any) error {
	return fmt.Errorf("%w: %s", broadcast.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// Broadcast builds the message, takes its resource keys (resolving its
// idempotency key first, R7.5), broadcasts it and waits for the result.
func (a *broadcastAPI) Broadcast(ctx context.Context, req *connect.Request[walcastv1.BroadcastRequest]) (*connect.Response[walcastv1.BroadcastResponse], error) {
	// A caller's W3C trace context (traceparent header) becomes the parent
	// of the broadcast's spans, and travels in the message (R9.6).
	ctx = requestTrace(ctx, req.Header())
	const proc = "Broadcast"
	r := req.Msg
	// Check what the API can before touching the broadcaster, so such a
	// request takes no lock; the engine checks the rest (registered type,
	// payload size, key length) before it creates anything.
	hd, err := a.parseHead(r.GetType(), r.GetResourceKeys(), r.GetIdempotencyKey())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	if d := r.GetRequestDigest(); len(d) > MaxRequestDigestBytes {
		return nil, a.fail(proc, invalidArg("request_digest is %d bytes, limit %d: send a hash of the request", len(d), MaxRequestDigestBytes))
	}
	copts, err := copyOptions(r)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	b, msg, err := a.checkedMessage(hd, r.GetPayload(), r.GetVchannels(), append(messageOptions(hd.ik, r.GetAckSyncUp(), r.GetProperties()), copts...))
	if err != nil {
		return nil, a.fail(proc, err)
	}
	areq := broadcast.AcquireRequest{Keys: hd.keys, NoWait: r.GetNoWait(), Unreplicable: r.GetUnreplicable()}
	if hd.ik != "" {
		areq.Idempotent = &broadcast.Idempotent{Type: hd.typ, Key: hd.ik}
		if d := r.GetRequestDigest(); len(d) > 0 {
			areq.Idempotent.Digest = d
		}
	}
	h, err := b.Acquire(ctx, areq)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	defer h.Close()
	res, err := h.Broadcast(ctx, msg)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(broadcastResponsePB(res)), nil
}

// copyOptions are the message options of a request's per-target copies
// (R13.10) and two-phase append (R13.11); the message checks that they
// name its targets.
func copyOptions(r *walcastv1.BroadcastRequest) ([]message.Option, error) {
	var opts []message.Option
	for v, c := range r.GetCopies() {
		if c == nil {
			return nil, invalidArg("copies[%s]: empty copy spec", v)
		}
		if n := len(c.GetRole()); n > MaxRoleBytes {
			return nil, invalidArg("copies[%s].role is %d bytes, limit %d", v, n, MaxRoleBytes)
		}
		var payload []byte
		if c.Payload != nil {
			payload = c.GetPayload()
			if payload == nil {
				payload = []byte{}
			}
		}
		opts = append(opts, message.WithCopy(message.VChannel(v), c.GetRole(), payload))
	}
	if af := r.GetAppendFirst(); len(af) > 0 {
		opts = append(opts, message.WithAppendFirst(vchannelsOf(af)...))
	}
	return opts, nil
}

// Ack records one consumer acknowledgement. The client cannot cancel it: an
// ack the node sent must not be half-processed because the node's RPC timed
// out (#45145); only the server's own bound ends it.
func (a *broadcastAPI) Ack(ctx context.Context, req *connect.Request[walcastv1.AckRequest]) (*connect.Response[walcastv1.AckResponse], error) {
	const proc = "Ack"
	r := req.Msg
	ack := broadcast.Ack{BroadcastID: r.GetBroadcastId(), VChannel: message.VChannel(r.GetVchannel())}
	if err := ack.VChannel.Validate(); err != nil {
		return nil, a.fail(proc, fmt.Errorf("%w: vchannel: %w", broadcast.ErrInvalidArgument, err))
	}
	if cp := r.GetCheckpoint(); cp != nil {
		ack.Checkpoint = wal.Checkpoint{MessageID: cp.GetMessageId(), TimeTick: cp.GetTimeTick(), LastConfirmed: cp.GetLastConfirmed()}
	}
	if n := len(r.GetExtra()); n > MaxExtraBytes {
		return nil, a.fail(proc, invalidArg("extra is %d bytes, limit %d: return a reference to a larger result", n, MaxExtraBytes))
	}
	ack.Extra = r.GetExtra()
	if n := len(r.GetNode()); n > MaxNodeNameBytes {
		return nil, a.fail(proc, invalidArg("node is %d bytes, limit %d", n, MaxNodeNameBytes))
	}
	// Consumers send the message only for a replicated copy (the engine
	// needs it only to create the task on a secondary), so ordinary acks
	// decode nothing.
	if raw := r.GetMessage(); len(raw) > 0 {
		m, err := message.Unmarshal(raw)
		if err != nil {
			return nil, a.fail(proc, fmt.Errorf("%w: message: %w", broadcast.ErrInvalidArgument, err))
		}
		switch {
		case ack.BroadcastID == 0:
			ack.BroadcastID = m.Broadcast.ID
		case m.Broadcast.ID != ack.BroadcastID:
			return nil, a.fail(proc, invalidArg("broadcast_id %d but the message is broadcast %d", ack.BroadcastID, m.Broadcast.ID))
		}
		ack.Message = m
	}
	if ack.BroadcastID == 0 {
		return nil, a.fail(proc, invalidArg("broadcast_id is required"))
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	actx := context.WithoutCancel(ctx)
	if a.cfg.ackTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(actx, a.cfg.ackTimeout)
		defer cancel()
	}
	if err := b.Ack(actx, ack); err != nil {
		return nil, a.fail(proc, a.notIssued(actx, ack.BroadcastID, err))
	}
	if a.cfg.ackSeen != nil {
		a.cfg.ackSeen(ackingNodeName(ctx, r.GetNode(), req.Peer().Addr), ack)
	}
	return connect.NewResponse(&walcastv1.AckResponse{}), nil
}

// ackingNodeName names the sender of an ack: the node's own name, else its
// authenticated identity, else its host.
func ackingNodeName(ctx context.Context, node, peer string) string {
	if node != "" {
		return node
	}
	if id, ok := auth.FromContext(ctx); ok && id.Name != "" {
		return id.Name
	}
	if host, _, err := net.SplitHostPort(peer); err == nil {
		peer = host
	}
	return "unnamed node at " + peer
}

// termChecker is a Leader that can tell whether a newer term exists (the
// Coordinator, from etcd's election).
type termChecker interface {
	NewerTerm(ctx context.Context) (bool, error)
}

// notIssued turns the engine's refusal of an ack of an id it never issued
// (broadcast.ErrNotIssued, with catalog.ErrFenced) into not_found when no
// newer term exists: nobody issued the id, and a consumer retrying it would
// retry forever. "Fenced" (Unavailable, retried at the leader) stays for a
// real newer term, or when the election cannot be read. A leader without an
// election (StaticLeader) has no newer term.
func (a *broadcastAPI) notIssued(ctx context.Context, id uint64, err error) error {
	if !errors.Is(err, broadcast.ErrNotIssued) {
		return err
	}
	if tc, ok := a.leader.(termChecker); ok {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		newer, cerr := tc.NewerTerm(cctx)
		cancel()
		if cerr != nil || newer {
			return err
		}
	}
	return fmt.Errorf("%w: broadcast %d: no leader of this cluster issued it (it is above every id this leader reserved, and this leader's term is the newest); do not retry this ack",
		broadcast.ErrNotFound, id)
}

// GetTask describes one task, live or tombstoned.
func (a *broadcastAPI) GetTask(ctx context.Context, req *connect.Request[walcastv1.GetTaskRequest]) (*connect.Response[walcastv1.Task], error) {
	const proc = "GetTask"
	b, ti, err := a.leaderTask(req.Msg.GetId())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	t := taskPB(ti)
	a.judge(ctx, b, t, ti.Type, ti.Outcome)
	return connect.NewResponse(t), nil
}

// ListTasks lists tasks by state, type and age, at most maxListTasks.
func (a *broadcastAPI) ListTasks(ctx context.Context, req *connect.Request[walcastv1.ListTasksRequest]) (*connect.Response[walcastv1.ListTasksResponse], error) {
	const proc = "ListTasks"
	r := req.Msg
	var f broadcast.Filter
	for i, s := range r.GetStates() {
		st, err := broadcast.ParseState(s)
		if err != nil {
			return nil, a.fail(proc, fmt.Errorf("states[%d]: %w", i, err))
		}
		f.States = append(f.States, st)
	}
	if s := r.GetType(); s != "" {
		t, err := message.ParseType(s)
		if err != nil {
			return nil, a.fail(proc, fmt.Errorf("%w: type: %w", broadcast.ErrInvalidArgument, err))
		}
		f.Type = t
	}
	if d := r.GetOlderThan(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, a.fail(proc, invalidArg("older_than must be a non-negative duration"))
		}
		f.OlderThan = d.AsDuration()
	}
	if r.GetLimit() < 0 {
		return nil, a.fail(proc, invalidArg("limit %d is negative", r.GetLimit()))
	}
	if r.GetBeforeId() != 0 && r.GetAfterId() != 0 && r.GetBeforeId() <= r.GetAfterId()+1 {
		return nil, a.fail(proc, invalidArg("before_id %d and after_id %d leave no id between them", r.GetBeforeId(), r.GetAfterId()))
	}
	f.AfterID, f.BeforeID, f.Newest = r.GetAfterId(), r.GetBeforeId(), !r.GetOldestFirst()
	if t := r.GetPageToken(); t != "" {
		last, err := taskCursor(t)
		if err != nil {
			return nil, a.fail(proc, err)
		}
		// The token narrows the bound in the request's order: the next
		// page holds tasks past the last one shown.
		if f.Newest && (f.BeforeID == 0 || last < f.BeforeID) {
			f.BeforeID = last
		} else if !f.Newest && last > f.AfterID {
			f.AfterID = last
		}
	}
	// A page never exceeds maxListTasks; one task more than the page is
	// asked for, to tell the client whether to ask again (more), so that a
	// cap is never silent.
	page := int(r.GetLimit())
	if a.cfg.maxListTasks > 0 && (page == 0 || page > a.cfg.maxListTasks) {
		page = a.cfg.maxListTasks
	}
	if page > 0 {
		f.Limit = page + 1
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	tasks, err := b.Tasks(f)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	out := &walcastv1.ListTasksResponse{}
	if page > 0 && len(tasks) > page {
		tasks, out.More = tasks[:page], true
		out.NextPageToken = taskToken(tasks[page-1].ID)
	}
	out.Tasks = make([]*walcastv1.Task, len(tasks))
	for i, ti := range tasks {
		out.Tasks[i] = taskPB(ti)
		a.judge(ctx, b, out.Tasks[i], ti.Type, ti.Outcome)
	}
	return connect.NewResponse(out), nil
}

// A ListTasks page token is opaque to clients: base64 of "task:" and the
// last task's id, as the metadata lists' tokens (meta/page.go) are of
// their kind and last item; a ListKeys one of "key:" and the last id its
// page went past.
const (
	taskTokenKind = "task"
	keyTokenKind  = "key"
)

// taskToken is the token of the page after the task last.
func taskToken(last uint64) string { return idToken(taskTokenKind, last) }

// taskCursor reads a ListTasks page token: the id of the last task shown.
func taskCursor(token string) (uint64, error) { return idCursor(taskTokenKind, token) }

// idToken is the token of a list of kind whose page ended at id last.
func idToken(kind string, last uint64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(kind + ":" + strconv.FormatUint(last, 10)))
}

// idCursor reads a page token of a list of kind: the id its page ended at.
func idCursor(kind, token string) (uint64, error) {
	bad := invalidArg("page_token %q is not a token of this list", token)
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil {
		return 0, bad
	}
	k, id, ok := strings.Cut(string(raw), ":")
	if !ok || k != kind {
		return 0, bad
	}
	n, err := strconv.ParseUint(id, 10, 64)
	if err != nil || n == 0 {
		return 0, bad
	}
	return n, nil
}

// ForceAck acks copies of a live task on behalf of consumers that are gone
// (R5.6: a task waiting for acks that will never come is resolved by an
// operator, not left hanging). Each copy must have been appended: the ack
// takes its append result as the checkpoint, as an ack without checkpoint
// does (R4.5). The audit log records who did it and the reason.
func (a *broadcastAPI) ForceAck(ctx context.Context, req *connect.Request[walcastv1.ForceAckRequest]) (*connect.Response[walcastv1.ForceAckResponse], error) {
	const proc = "ForceAck"
	r := req.Msg
	switch {
	case r.GetId() == 0:
		return nil, a.fail(proc, invalidArg("id is required"))
	case len(r.GetVchannels()) == 0:
		return nil, a.fail(proc, invalidArg("vchannels: name at least one vchannel of the task to ack"))
	case strings.TrimSpace(r.GetReason()) == "":
		return nil, a.fail(proc, invalidArg("reason is required: it is written to the audit log"))
	case len(r.GetReason()) > MaxReasonBytes:
		return nil, a.fail(proc, invalidArg("reason is %d bytes, limit %d", len(r.GetReason()), MaxReasonBytes))
	}
	want, err := validVChannels(r.GetVchannels())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	b, ti, err := a.leaderTask(r.GetId())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	if ti.State == broadcast.Tombstone {
		return nil, a.fail(proc, fmt.Errorf("%w: task %d is finished (TOMBSTONE): nothing to ack", broadcast.ErrFailedPrecondition, ti.ID))
	}
	// Check every vchannel before acking any, so a typo changes nothing.
	idx := make([]int, len(want))
	for n, v := range want {
		if idx[n] = slices.IndexFunc(ti.VChannels, func(vi broadcast.VChannelInfo) bool { return vi.VChannel == v }); idx[n] < 0 {
			return nil, a.fail(proc, fmt.Errorf("%w: %s is not a target of task %d", broadcast.ErrVChannelNotInTask, v, ti.ID))
		}
	}
	var acks []message.VChannel
	for n, v := range want {
		switch vi := ti.VChannels[idx[n]]; {
		case vi.Acked:
			continue // acks are idempotent: nothing to do
		case !vi.Appended:
			// Acking a copy that is not in the WAL would run the
			// callback for a message a consumer may never see; a
			// replicated copy that never arrived has no append result
			// an ack could take.
			return nil, a.fail(proc, fmt.Errorf("%w: task %d has no append result for %s (its copy is not known to be in this cluster's WAL): only an appended copy can be acked for its consumer",
				broadcast.ErrFailedPrecondition, ti.ID, v))
		}
		acks = append(acks, v)
	}
	for _, v := range acks {
		if err := b.Ack(ctx, broadcast.Ack{BroadcastID: ti.ID, VChannel: v}); err != nil {
			return nil, a.fail(proc, err)
		}
	}
	a.cfg.logger.Warn("copies acked by an operator", "task", ti.ID, "vchannels", acks, "reason", r.GetReason())
	after, err := b.Task(ti.ID)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.ForceAckResponse{Task: taskPB(after)}), nil
}

// ListTypes lists the registered message types, sorted.
func (a *broadcastAPI) ListTypes(context.Context, *connect.Request[walcastv1.ListTypesRequest]) (*connect.Response[walcastv1.ListTypesResponse], error) {
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail("ListTypes", err)
	}
	reg := b.Types()
	ts := reg.Types()
	slices.SortFunc(ts, func(x, y message.Type) int { return strings.Compare(x.String(), y.String()) })
	out := &walcastv1.ListTypesResponse{}
	for _, t := range ts {
		info, _ := reg.Lookup(t)
		out.Types = append(out.Types, &walcastv1.MessageType{Type: t.String(), AckSyncUp: info.AckSyncUp,
			Unreplicable: info.Unreplicable, ExclusiveAppend: info.ExclusiveAppend})
	}
	return connect.NewResponse(out), nil
}

// ListLocks shows the issuance lock table (R3.7).
func (a *broadcastAPI) ListLocks(context.Context, *connect.Request[walcastv1.ListLocksRequest]) (*connect.Response[walcastv1.ListLocksResponse], error) {
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail("ListLocks", err)
	}
	locks := b.Locks()
	out := &walcastv1.ListLocksResponse{Locks: make([]*walcastv1.LockState, len(locks))}
	for i, ks := range locks {
		out.Locks[i] = &walcastv1.LockState{Domain: ks.Domain.String(), Name: ks.Name,
			Holders: holdersPB(ks.Holders), Waiters: holdersPB(ks.Waiters)}
	}
	return connect.NewResponse(out), nil
}

// LookupKey reports the original of an idempotency key without waiting.
func (a *broadcastAPI) LookupKey(ctx context.Context, req *connect.Request[walcastv1.LookupKeyRequest]) (*connect.Response[walcastv1.LookupKeyResponse], error) {
	const proc = "LookupKey"
	typ, err := message.ParseType(req.Msg.GetType())
	if err != nil {
		return nil, a.fail(proc, fmt.Errorf("%w: type: %w", broadcast.ErrInvalidArgument, err))
	}
	ik, err := message.ParseIdempotencyKey(req.Msg.GetIdempotencyKey())
	if err != nil {
		return nil, a.fail(proc, fmt.Errorf("%w: idempotency_key: %w", broadcast.ErrInvalidArgument, err))
	}
	if ik == "" {
		return nil, a.fail(proc, invalidArg("idempotency_key is required"))
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	ks, err := b.Lookup(ctx, typ, ik)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	w := ks.Window
	state := ks.State.String()
	if ks.Persisting {
		// Not final: the id may yet be forgotten by a crash (R7.5).
		state = "PERSISTING"
	}
	out := &walcastv1.LookupKeyResponse{
		BroadcastId: ks.BroadcastID,
		State:       state,
		Outcome:     outcomePB(ks.Outcome),
		Window:      windowPB(&w),
	}
	var t walcastv1.Task
	a.judge(ctx, b, &t, typ, ks.Outcome)
	out.ApplicationOutcome = t.ApplicationOutcome
	return connect.NewResponse(out), nil
}

// ListKeys lists the remembered idempotency keys a page at a time, by
// their originals' ids, at most maxListTasks a page (R7.5).
func (a *broadcastAPI) ListKeys(ctx context.Context, req *connect.Request[walcastv1.ListKeysRequest]) (*connect.Response[walcastv1.ListKeysResponse], error) {
	const proc = "ListKeys"
	r := req.Msg
	if r.GetLimit() < 0 {
		return nil, a.fail(proc, invalidArg("limit %d is negative", r.GetLimit()))
	}
	var after uint64
	if t := r.GetPageToken(); t != "" {
		var err error
		if after, err = idCursor(keyTokenKind, t); err != nil {
			return nil, a.fail(proc, err)
		}
	}
	page := int(r.GetLimit())
	if page == 0 || a.cfg.maxListTasks > 0 && page > a.cfg.maxListTasks {
		page = a.cfg.maxListTasks
	}
	if page <= 0 {
		page = DefaultMaxListTasks
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	keys, next, err := b.Keys(ctx, after, page)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	out := &walcastv1.ListKeysResponse{Keys: make([]*walcastv1.KeyEntry, len(keys))}
	if next != 0 {
		out.NextPageToken = idToken(keyTokenKind, next)
	}
	for i, ks := range keys {
		out.Keys[i] = keyEntryPB(ks)
		var t walcastv1.Task
		a.judge(ctx, b, &t, ks.Message.Type, ks.Outcome)
		out.Keys[i].ApplicationOutcome = t.ApplicationOutcome
	}
	return connect.NewResponse(out), nil
}

// keyEntryPB is the API's view of a remembered key: its raw key stays
// out, as in logs (R7.7).
func keyEntryPB(ks *broadcast.KeyStatus) *walcastv1.KeyEntry {
	w := ks.Window
	k := ks.Message.IdempotencyKey
	state := ks.State.String()
	if ks.Persisting {
		state = "PERSISTING"
	}
	return &walcastv1.KeyEntry{Type: ks.Message.Type.String(), Scope: k.ScopeName(), KeyFingerprint: k.Fingerprint(),
		BroadcastId: ks.BroadcastID, State: state, Outcome: outcomePB(ks.Outcome), Window: windowPB(&w)}
}

// RetryCallback makes a failing callback retry now (R5.6).
func (a *broadcastAPI) RetryCallback(_ context.Context, req *connect.Request[walcastv1.RetryCallbackRequest]) (*connect.Response[walcastv1.RetryCallbackResponse], error) {
	const proc = "RetryCallback"
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	if err := b.RetryCallback(req.Msg.GetId()); err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.RetryCallbackResponse{}), nil
}

// CompleteCallback completes a stuck callback without its effects (R5.6). The
// reason is required: it is the task's recorded outcome detail, and
// duplicates report it.
func (a *broadcastAPI) CompleteCallback(ctx context.Context, req *connect.Request[walcastv1.CompleteCallbackRequest]) (*connect.Response[walcastv1.CompleteCallbackResponse], error) {
	const proc = "CompleteCallback"
	if req.Msg.GetReason() == "" {
		return nil, a.fail(proc, invalidArg("reason is required: it is recorded as the task's outcome"))
	}
	if n := len(req.Msg.GetReason()); n > MaxReasonBytes {
		return nil, a.fail(proc, invalidArg("reason is %d bytes, limit %d", n, MaxReasonBytes))
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	if err := b.CompleteCallback(ctx, req.Msg.GetId(), req.Msg.GetReason()); err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.CompleteCallbackResponse{}), nil
}

func checkpointPB(c wal.Checkpoint) *walcastv1.Checkpoint {
	return &walcastv1.Checkpoint{MessageId: c.MessageID, TimeTick: c.TimeTick, LastConfirmed: c.LastConfirmed}
}

// outcomePB returns nil for the zero outcome (a task still running).
func outcomePB(o broadcast.Outcome) *walcastv1.Outcome {
	var s walcastv1.OutcomeStatus
	switch o.Status {
	case 0:
		return nil
	case broadcast.Succeeded:
		s = walcastv1.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED
	case broadcast.Failed:
		s = walcastv1.OutcomeStatus_OUTCOME_STATUS_FAILED
	case broadcast.ForceCompleted:
		s = walcastv1.OutcomeStatus_OUTCOME_STATUS_FORCE_COMPLETED
	case broadcast.Ignored:
		s = walcastv1.OutcomeStatus_OUTCOME_STATUS_IGNORED
	}
	return &walcastv1.Outcome{Status: s, Detail: o.Detail, Data: o.Data}
}

func windowPB(w *broadcast.Window) *walcastv1.Window {
	if w == nil {
		return nil
	}
	return &walcastv1.Window{
		FirstSeen:     timePB(w.FirstSeen),
		CompletedAt:   timePB(w.CompletedAt),
		ExpiresLatest: timePB(w.ExpiresLatest),
		CountHeadroom: int64(w.CountHeadroom),
		Class:         w.Class, ClassEarlyEvicted: int64(w.ClassEarlyEvicted),
	}
}

// timePB returns nil for an unset time: the zero time, or the Unix epoch
// the engine decodes an unset persisted time to.
func timePB(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() || t.UnixNano() == 0 {
		return nil
	}
	return timestamppb.New(t)
}

func taskPB(ti broadcast.TaskInfo) *walcastv1.Task {
	t := &walcastv1.Task{
		Id:              ti.ID,
		Type:            ti.Type.String(),
		State:           ti.State.String(),
		CreatedAt:       timePB(ti.CreatedAt),
		CompletedAt:     timePB(ti.CompletedAt),
		ResourceKeys:    make([]string, len(ti.ResourceKeys)),
		Vchannels:       make([]*walcastv1.VChannelState, len(ti.VChannels)),
		KeyFingerprint:  ti.KeyFingerprint,
		AckSyncUp:       ti.AckSyncUp,
		AppendAttempts:  int64(ti.AppendAttempts),
		LastAppendError: ti.LastAppendError,
		Callback: &walcastv1.CallbackState{
			Running:       ti.Callback.Running,
			Attempts:      int64(ti.Callback.Attempts),
			LastError:     ti.Callback.LastError,
			LastAttemptAt: timePB(ti.Callback.LastAttemptAt),
			NextAttemptAt: timePB(ti.Callback.NextAttemptAt),
		},
		Outcome:        outcomePB(ti.Outcome),
		CatalogCommits: int64(ti.CatalogCommits),
		// A tombstone does not keep its count (the engine's TaskInfo
		// reports 0 for it).
		CatalogCommitsKnown: ti.State != broadcast.Tombstone,
		Stage:               ti.Stage,
	}
	for i, k := range ti.ResourceKeys {
		t.ResourceKeys[i] = k.String()
	}
	for i, v := range ti.VChannels {
		t.Vchannels[i] = &walcastv1.VChannelState{Vchannel: string(v.VChannel), Appended: v.Appended, Acked: v.Acked,
			Checkpoint: checkpointPB(v.Checkpoint), Extra: ti.Extras[v.VChannel]}
		if m := ti.Message; m != nil {
			t.Vchannels[i].CopyRole = m.RoleFor(v.VChannel)
			t.Vchannels[i].AppendFirst = m.AppendsFirst(v.VChannel)
		}
	}
	if ti.Message != nil {
		t.Payload = ti.Message.Payload
		t.Group = groupHeaderPB(ti.Message.Group)
	}
	t.HoldsKeys, t.ReleasedBy = ti.HoldsKeys, ti.ReleasedBy
	return t
}

func holdersPB(hs []resource.Holder) []*walcastv1.LockHolder {
	if len(hs) == 0 {
		return nil
	}
	out := make([]*walcastv1.LockHolder, len(hs))
	for i, h := range hs {
		out[i] = &walcastv1.LockHolder{Owner: h.Owner, Mode: h.Mode.String(), Since: timePB(h.Since)}
	}
	return out
}
