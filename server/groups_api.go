package server

import (
	"context"
	"fmt"
	"slices"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// This file holds BroadcastService's group RPCs (R13.1-R13.8: transactions
// and the open groups of resource-key owners) and WaitVChannelsAcked
// (R13.11).

// BeginTxn opens a transaction: its Begin broadcast takes the resource keys
// (resolving the admission identity first, so a retry returns the open
// transaction without waiting for its keys, R13.2) and the transaction holds
// them until its Commit or Rollback.
func (a *broadcastAPI) BeginTxn(ctx context.Context, req *connect.Request[walcastv1.BeginTxnRequest]) (*connect.Response[walcastv1.BeginTxnResponse], error) {
	const proc = "BeginTxn"
	// The caller's trace context joins the Begin's spans, as Broadcast's.
	ctx = requestTrace(ctx, req.Header())
	r := req.Msg
	hd, err := a.parseHead(r.GetType(), r.GetResourceKeys(), r.GetIdempotencyKey())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	b, msg, err := a.checkedMessage(hd, r.GetPayload(), r.GetVchannels(), messageOptions(hd.ik, false, r.GetProperties()))
	if err != nil {
		return nil, a.fail(proc, err)
	}
	treq := broadcast.TxnRequest{Keys: hd.keys, NoWait: r.GetNoWait()}
	if hd.ik != "" {
		treq.Idempotent = &broadcast.Idempotent{Type: hd.typ, Key: hd.ik}
	}
	x, err := b.BeginTxn(ctx, treq, msg)
	if err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.BeginTxnResponse{TxnId: x.ID, Duplicated: x.Duplicate, Begin: broadcastResponsePB(x.Begin)}), nil
}

// TxnMember broadcasts a body, the Commit or the Rollback of an open
// transaction (R13.1-R13.3), resumed by id: it may run on a coordinator that
// did not see the Begin.
func (a *broadcastAPI) TxnMember(ctx context.Context, req *connect.Request[walcastv1.TxnMemberRequest]) (*connect.Response[walcastv1.TxnMemberResponse], error) {
	const proc = "TxnMember"
	ctx = requestTrace(ctx, req.Header())
	r := req.Msg
	if r.GetTxnId() == 0 {
		return nil, a.fail(proc, invalidArg("txn_id is required"))
	}
	kind := r.GetKind()
	switch kind {
	case walcastv1.GroupKind_GROUP_KIND_BODY, walcastv1.GroupKind_GROUP_KIND_COMMIT, walcastv1.GroupKind_GROUP_KIND_ROLLBACK:
	default:
		return nil, a.fail(proc, invalidArg("kind %s: a member is GROUP_KIND_BODY, GROUP_KIND_COMMIT or GROUP_KIND_ROLLBACK (BeginTxn opens a transaction)", kind))
	}
	hd, err := a.parseHead(r.GetType(), nil, r.GetIdempotencyKey())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	// The members keep the Begin's targets: the message has none of its
	// own, and the broadcaster stamps the transaction's.
	msg := &message.Message{Type: hd.typ, Payload: r.GetPayload(), IdempotencyKey: hd.ik}
	for _, o := range messageOptions(hd.ik, false, r.GetProperties()) {
		o(msg)
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	x, err := b.ResumeTxn(r.GetTxnId())
	var res *broadcast.Result
	switch {
	case err != nil:
		res, err = answerRetry(ctx, b, r.GetTxnId(), groupKindOf(kind), msg, err)
	case kind == walcastv1.GroupKind_GROUP_KIND_BODY:
		res, err = x.Body(ctx, msg)
	case kind == walcastv1.GroupKind_GROUP_KIND_COMMIT:
		res, err = x.Commit(ctx, msg)
	default:
		res, err = x.Rollback(ctx, msg)
	}
	if err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.TxnMemberResponse{Result: broadcastResponsePB(res)}), nil
}

// answerRetry answers a member of a transaction ResumeTxn refused with
// rerr (it ended, or is unknown): a retried member with the idempotency key
// of one of the transaction's members of that kind gets that member's
// result, as the engine gives a retried end (R13.3); anything else keeps
// rerr. (The library resumes only open transactions, so the API resolves
// the key itself.)
func answerRetry(ctx context.Context, b *broadcast.Broadcaster, id uint64, kind message.GroupKind, msg *message.Message, rerr error) (*broadcast.Result, error) {
	if msg.IdempotencyKey == "" {
		return nil, rerr
	}
	h, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: msg.Type, Key: msg.IdempotencyKey})
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if !h.Duplicate() {
		return nil, rerr
	}
	res, err := h.Broadcast(ctx, msg)
	if err != nil {
		return nil, err
	}
	if g := res.Duplicated.Group; g == nil || g.ID != id || g.Kind != kind {
		return nil, fmt.Errorf("%w: the idempotency key belongs to broadcast %d, not to the %s of transaction %d",
			broadcast.ErrKeyReusedWithDifferentPayload, res.BroadcastID, kind, id)
	}
	return res, nil
}

// GetGroup describes one open group.
func (a *broadcastAPI) GetGroup(_ context.Context, req *connect.Request[walcastv1.GetGroupRequest]) (*connect.Response[walcastv1.Group], error) {
	const proc = "GetGroup"
	if req.Msg.GetId() == 0 {
		return nil, a.fail(proc, invalidArg("id is required"))
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	g, err := b.Group(req.Msg.GetId())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	return connect.NewResponse(groupPB(g)), nil
}

// ListGroups lists the open groups, in id order.
func (a *broadcastAPI) ListGroups(context.Context, *connect.Request[walcastv1.ListGroupsRequest]) (*connect.Response[walcastv1.ListGroupsResponse], error) {
	const proc = "ListGroups"
	b, err := a.leader.Current()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	gs, err := b.Groups()
	if err != nil {
		return nil, a.fail(proc, err)
	}
	out := &walcastv1.ListGroupsResponse{Groups: make([]*walcastv1.Group, len(gs))}
	for i, g := range gs {
		out.Groups[i] = groupPB(g)
	}
	return connect.NewResponse(out), nil
}

// WaitVChannelsAcked waits until the copies of a broadcast on the named
// vchannels are acked (R13.11), within the call's deadline, and returns the
// task then.
func (a *broadcastAPI) WaitVChannelsAcked(ctx context.Context, req *connect.Request[walcastv1.WaitVChannelsAckedRequest]) (*connect.Response[walcastv1.WaitVChannelsAckedResponse], error) {
	const proc = "WaitVChannelsAcked"
	r := req.Msg
	if r.GetId() == 0 {
		return nil, a.fail(proc, invalidArg("id is required"))
	}
	if len(r.GetVchannels()) == 0 {
		return nil, a.fail(proc, invalidArg("vchannels: name at least one target of the broadcast"))
	}
	vs, err := validVChannels(r.GetVchannels())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	// The engine answers a finished task at once whatever the vchannels;
	// a vchannel the task never targeted is refused here too.
	b, ti, err := a.leaderTask(r.GetId())
	if err != nil {
		return nil, a.fail(proc, err)
	}
	for _, v := range vs {
		if !slices.ContainsFunc(ti.VChannels, func(vi broadcast.VChannelInfo) bool { return vi.VChannel == v }) {
			return nil, a.fail(proc, fmt.Errorf("%w: %s is not a target of task %d", broadcast.ErrVChannelNotInTask, v, ti.ID))
		}
	}
	if err := b.WaitVChannelsAcked(ctx, r.GetId(), vs...); err != nil {
		return nil, a.fail(proc, err)
	}
	if ti, err = b.Task(r.GetId()); err != nil {
		return nil, a.fail(proc, err)
	}
	t := taskPB(ti)
	a.judge(ctx, b, t, ti.Type, ti.Outcome)
	return connect.NewResponse(&walcastv1.WaitVChannelsAckedResponse{Task: t}), nil
}

// requestHead is what a request that broadcasts (Broadcast, BeginTxn,
// TxnMember) starts with, parsed and checked.
type requestHead struct {
	typ  message.Type
	keys []resource.Key
	ik   message.IdempotencyKey
}

// parseHead parses a broadcasting request's type (refusing those
// BroadcastService must not broadcast), resource keys and idempotency key,
// before the request touches the broadcaster, so that a bad one takes no
// lock.
func (a *broadcastAPI) parseHead(typ string, keys []string, ik string) (requestHead, error) {
	var hd requestHead
	var err error
	if hd.typ, err = a.checkType(typ); err != nil {
		return hd, err
	}
	if hd.keys, err = parseKeys(keys); err != nil {
		return hd, err
	}
	if hd.ik, err = message.ParseIdempotencyKey(ik); err != nil {
		return hd, fmt.Errorf("%w: idempotency_key: %w", broadcast.ErrInvalidArgument, err)
	}
	return hd, nil
}

// checkedMessage builds the message of a broadcasting request and returns
// it with the leader's broadcaster once the broadcaster accepts it: bad
// input (an unregistered type, a payload too large, targets on pchannels the
// cluster lacks) is refused before waiting for resource keys held by others.
func (a *broadcastAPI) checkedMessage(hd requestHead, payload []byte, vchannels []string, opts []message.Option) (*broadcast.Broadcaster, *message.Message, error) {
	msg, err := message.NewBroadcast(hd.typ, payload, vchannelsOf(vchannels), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", broadcast.ErrInvalidArgument, err)
	}
	b, err := a.leader.Current()
	if err != nil {
		return nil, nil, err
	}
	if err := b.Check(msg); err != nil {
		return nil, nil, err
	}
	return b, msg, nil
}

// checkType parses a request's type and refuses the types BroadcastService
// must not broadcast.
func (a *broadcastAPI) checkType(s string) (message.Type, error) {
	typ, err := message.ParseType(s)
	if err != nil {
		return typ, fmt.Errorf("%w: type: %w", broadcast.ErrInvalidArgument, err)
	}
	if a.cfg.reserved[typ] || typ == broadcast.AlterReplicateConfig {
		return typ, invalidArg("type %s is broadcast by its own API (validated under its locks), not by BroadcastService", typ)
	}
	return typ, nil
}

// parseKeys parses a request's resource keys.
func parseKeys(ss []string) ([]resource.Key, error) {
	keys := make([]resource.Key, len(ss))
	for i, s := range ss {
		k, err := resource.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("%w: resource_keys[%d]: %w", broadcast.ErrInvalidArgument, i, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// validVChannels parses a request's vchannels, each checked.
func validVChannels(ss []string) ([]message.VChannel, error) {
	vs := vchannelsOf(ss)
	for i, v := range vs {
		if err := v.Validate(); err != nil {
			return nil, fmt.Errorf("%w: vchannels[%d]: %w", broadcast.ErrInvalidArgument, i, err)
		}
	}
	return vs, nil
}

// leaderTask returns the leader's broadcaster and its task id.
func (a *broadcastAPI) leaderTask(id uint64) (*broadcast.Broadcaster, broadcast.TaskInfo, error) {
	b, err := a.leader.Current()
	if err != nil {
		return nil, broadcast.TaskInfo{}, err
	}
	ti, err := b.Task(id)
	return b, ti, err
}

func vchannelsOf(ss []string) []message.VChannel {
	vs := make([]message.VChannel, len(ss))
	for i, s := range ss {
		vs[i] = message.VChannel(s)
	}
	return vs
}

// messageOptions are the options of a request's message: its idempotency
// key, AckSyncUp and properties.
func messageOptions(ik message.IdempotencyKey, syncUp bool, props map[string]string) []message.Option {
	if ik == "" && !syncUp && len(props) == 0 {
		return nil // a new message has none of them: no closure to allocate
	}
	opts := []message.Option{message.WithIdempotencyKey(ik)}
	if syncUp {
		opts = append(opts, message.WithAckSyncUp())
	}
	for k, v := range props {
		opts = append(opts, message.WithProperty(k, v))
	}
	return opts
}

// broadcastResponsePB is the API's form of a broadcast's result.
func broadcastResponsePB(res *broadcast.Result) *walcastv1.BroadcastResponse {
	if res == nil {
		return nil
	}
	out := &walcastv1.BroadcastResponse{
		BroadcastId: res.BroadcastID,
		Appends:     make(map[string]*walcastv1.Checkpoint, len(res.Appends)),
		Duplicated:  res.Duplicated != nil,
		Outcome:     outcomePB(res.Outcome),
		Window:      windowPB(res.Window),
	}
	for v, cp := range res.Appends.All() {
		out.Appends[string(v)] = checkpointPB(cp)
	}
	if len(res.Extras) > 0 {
		out.Extras = make(map[string][]byte, len(res.Extras))
		for v, x := range res.Extras {
			out.Extras[string(v)] = x
		}
	}
	return out
}

// groupKinds pairs the API's group kinds with the engine's.
var groupKinds = [...]struct {
	pb   walcastv1.GroupKind
	kind message.GroupKind
}{
	{walcastv1.GroupKind_GROUP_KIND_BEGIN, message.GroupBegin},
	{walcastv1.GroupKind_GROUP_KIND_BODY, message.GroupBody},
	{walcastv1.GroupKind_GROUP_KIND_COMMIT, message.GroupCommit},
	{walcastv1.GroupKind_GROUP_KIND_ROLLBACK, message.GroupRollback},
}

func groupKindOf(k walcastv1.GroupKind) message.GroupKind {
	for _, p := range groupKinds {
		if p.pb == k {
			return p.kind
		}
	}
	return 0
}

func groupKindPB(k message.GroupKind) walcastv1.GroupKind {
	for _, p := range groupKinds {
		if p.kind == k {
			return p.pb
		}
	}
	return walcastv1.GroupKind_GROUP_KIND_UNSPECIFIED
}

func groupHeaderPB(h *message.GroupHeader) *walcastv1.GroupHeader {
	if h == nil {
		return nil
	}
	return &walcastv1.GroupHeader{Id: h.ID, Seq: h.Seq, Kind: groupKindPB(h.Kind), OwnerKey: h.OwnerKey}
}

func groupPB(g broadcast.GroupInfo) *walcastv1.Group {
	out := &walcastv1.Group{Id: g.ID, OwnerKey: g.OwnerKey, Holding: g.Holding, HoldsHere: g.HoldsHere,
		EndingId: g.Ending, EndingKind: groupKindPB(g.EndingKind), Queued: int32(g.Queued)}
	for _, k := range g.Keys {
		out.ResourceKeys = append(out.ResourceKeys, k.String())
	}
	for _, v := range g.Targets {
		out.Vchannels = append(out.Vchannels, string(v))
	}
	for _, m := range g.Members {
		out.Members = append(out.Members, &walcastv1.GroupMember{Id: m.ID, Seq: m.Seq, Kind: groupKindPB(m.Kind), Stage: m.Stage.String()})
	}
	return out
}
