package client

import (
	"context"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// BeginTxnRequest opens a broadcast transaction (R13.1): one set of
// resource keys held across its Begin, its bodies and its Commit or
// Rollback, which may come in separate calls, from separate processes,
// across coordinator restarts.
type BeginTxnRequest struct {
	// Type and Payload are the Begin broadcast's; VChannels are the
	// targets of every member (the control channel is added).
	Type         message.Type
	Payload      []byte
	VChannels    []message.VChannel
	ResourceKeys []resource.Key
	// Scope and ClientKey are the transaction's admission identity, as in
	// BroadcastRequest: a repeated BeginTxn with them returns the
	// transaction it opened (Txn.Duplicated) without waiting for its keys
	// (R13.2). With a Scope and no ClientKey, one is minted and stored
	// here. Without a Scope, BeginTxn is retried only when the server
	// certainly did nothing.
	Scope     Scope
	ClientKey string
	// NoWait fails at once with an error matching ErrBusy instead of
	// queueing for the keys (R13.15).
	NoWait     bool
	Properties map[string]string
}

// Txn is an open (or resumed) transaction.
type Txn struct {
	// ID names the transaction: its Begin's broadcast id. Pass it to
	// TxnBody, CommitTxn and RollbackTxn, from any process.
	ID uint64
	// Duplicated is set when BeginTxn was a repeat answered by the
	// transaction it had opened.
	Duplicated bool
	// Begin is the Begin's result. The transaction holds its keys whatever
	// the Begin's callback reported: one whose callback failed is the
	// caller's to roll back.
	Begin *BroadcastResult
}

// TxnMemberRequest is a body, Commit or Rollback of a transaction. Its
// targets and keys are the transaction's.
type TxnMemberRequest struct {
	Type    message.Type
	Payload []byte
	// Scope and ClientKey make the member idempotent, as in
	// BroadcastRequest: a repeat is answered by the original, even after
	// the transaction ended. Without them a member is retried only when
	// the server certainly did nothing.
	Scope      Scope
	ClientKey  string
	Properties map[string]string
}

// BeginTxn opens a transaction with its Begin and returns once the Begin's
// callback ran: from then on the transaction holds req.ResourceKeys, until
// CommitTxn or RollbackTxn. Limits (members, bytes per member, targets)
// are the server's txn settings: beyond them it fails with ErrTxnFull or
// ErrInvalidArgument.
func (c *Client) BeginTxn(ctx context.Context, req *BeginTxnRequest) (*Txn, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	key, err := scopedKey(req.Scope, &req.ClientKey)
	if err != nil {
		return nil, err
	}
	pb := &walcastv1.BeginTxnRequest{Type: typeName(req.Type), Payload: req.Payload, Vchannels: strs(req.VChannels),
		ResourceKeys: keyStrs(req.ResourceKeys), IdempotencyKey: string(key), NoWait: req.NoWait, Properties: req.Properties}
	var resp *walcastv1.BeginTxnResponse
	n, err := c.call(ctx, policyOf(key), func(ctx context.Context, e *endpoint) error {
		r, err := e.broadcast.BeginTxn(ctx, connect.NewRequest(pb))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Txn{ID: resp.GetTxnId(), Duplicated: resp.GetDuplicated(), Begin: resultOf(resp.GetBegin(), key, n)}, nil
}

// TxnBody broadcasts a body of open transaction id. Bodies are created one
// at a time and their callbacks take effect in order (R13.2); one beyond
// the member limit fails with ErrTxnFull (the last member is kept for the
// end). An ended transaction refuses it with ErrFailedPrecondition.
func (c *Client) TxnBody(ctx context.Context, id uint64, req *TxnMemberRequest) (*BroadcastResult, error) {
	return c.txnMember(ctx, id, walcastv1.GroupKind_GROUP_KIND_BODY, req)
}

// CommitTxn ends transaction id with a Commit: once it took effect the
// keys are released (R13.3). The first end wins: a concurrent Commit joins
// it, a Rollback after a Commit fails with ErrFailedPrecondition.
func (c *Client) CommitTxn(ctx context.Context, id uint64, req *TxnMemberRequest) (*BroadcastResult, error) {
	return c.txnMember(ctx, id, walcastv1.GroupKind_GROUP_KIND_COMMIT, req)
}

// RollbackTxn ends transaction id with a Rollback, as CommitTxn does.
func (c *Client) RollbackTxn(ctx context.Context, id uint64, req *TxnMemberRequest) (*BroadcastResult, error) {
	return c.txnMember(ctx, id, walcastv1.GroupKind_GROUP_KIND_ROLLBACK, req)
}

func (c *Client) txnMember(ctx context.Context, id uint64, kind walcastv1.GroupKind, req *TxnMemberRequest) (*BroadcastResult, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	if id == 0 {
		return nil, invalidRequest("transaction id 0")
	}
	key, err := scopedKey(req.Scope, &req.ClientKey)
	if err != nil {
		return nil, err
	}
	pb := &walcastv1.TxnMemberRequest{TxnId: id, Kind: kind, Type: typeName(req.Type), Payload: req.Payload,
		IdempotencyKey: string(key), Properties: req.Properties}
	var resp *walcastv1.TxnMemberResponse
	n, err := c.call(ctx, policyOf(key), func(ctx context.Context, e *endpoint) error {
		r, err := e.broadcast.TxnMember(ctx, connect.NewRequest(pb))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return resultOf(resp.GetResult(), key, n), nil
}

// GetGroup describes open group id: a transaction or a resource-key owner
// (R13.6). One that ended fails with ErrFailedPrecondition, an unknown id
// with ErrNotFound.
func (c *Client) GetGroup(ctx context.Context, id uint64) (*walcastv1.Group, error) {
	return unary(ctx, c, &walcastv1.GetGroupRequest{Id: id}, walcastv1connect.BroadcastServiceClient.GetGroup)
}

// ListGroups lists the open groups, in id order.
func (c *Client) ListGroups(ctx context.Context) ([]*walcastv1.Group, error) {
	r, err := unary(ctx, c, &walcastv1.ListGroupsRequest{}, walcastv1connect.BroadcastServiceClient.ListGroups)
	return r.GetGroups(), err
}

// WaitVChannelsAcked returns once every copy of broadcast id on vchannels
// is acked (R13.11): the first phase of a two-phase append, or any partial
// set; at once for a finished broadcast. It returns the task then, with
// the copies' checkpoints and extras. ctx bounds the wait; a vchannel the
// broadcast does not target fails with ErrInvalidArgument.
func (c *Client) WaitVChannelsAcked(ctx context.Context, id uint64, vchannels ...message.VChannel) (*walcastv1.Task, error) {
	r, err := unary(ctx, c, &walcastv1.WaitVChannelsAckedRequest{Id: id, Vchannels: strs(vchannels)},
		walcastv1connect.BroadcastServiceClient.WaitVChannelsAcked)
	return r.GetTask(), err
}
