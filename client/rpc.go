package client

import (
	"context"
	"iter"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/message"
)

// unary runs one RPC that is safe to repeat, with the client's retries.
func unary[Req, Res any](ctx context.Context, c *Client, msg *Req,
	rpc func(walcastv1connect.BroadcastServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Res], error),
) (*Res, error) {
	var out *Res
	_, err := c.call(ctx, anyTransient, func(ctx context.Context, e *endpoint) error {
		r, err := rpc(e.broadcast, ctx, connect.NewRequest(msg))
		if err == nil {
			out = r.Msg
		}
		return err
	})
	return out, err
}

// Ack acknowledges one consumed copy. Acks are idempotent (R4.5), so every
// transient failure is retried until ctx ends; a consumer that must not lose
// an ack gives it a context its own shutdown does not cancel.
// AckRequest.Message is needed only for a replicated copy (a message with a
// replicate header), whose task a secondary creates from it; leave it empty
// otherwise.
func (c *Client) Ack(ctx context.Context, req *walcastv1.AckRequest) error {
	if req == nil {
		return invalidRequest("nil request")
	}
	_, err := unary(ctx, c, req, walcastv1connect.BroadcastServiceClient.Ack)
	return err
}

// GetTask describes one task.
func (c *Client) GetTask(ctx context.Context, id uint64) (*walcastv1.Task, error) {
	return unary(ctx, c, &walcastv1.GetTaskRequest{Id: id}, walcastv1connect.BroadcastServiceClient.GetTask)
}

// ListTasks lists tasks filtered by state, type and age, newest first
// (req.OldestFirst: oldest first), at most req.Limit of them (0: all): it
// asks page after page, since the server caps a page (ListTasksPage).
func (c *Client) ListTasks(ctx context.Context, req *walcastv1.ListTasksRequest) ([]*walcastv1.Task, error) {
	if req == nil {
		req = &walcastv1.ListTasksRequest{}
	}
	page := proto.CloneOf(req)
	var out []*walcastv1.Task
	for {
		if req.GetLimit() > 0 {
			page.Limit = req.GetLimit() - int32(len(out))
		}
		r, err := c.ListTasksPage(ctx, page)
		if err != nil {
			return nil, err
		}
		out = append(out, r.GetTasks()...)
		if !r.GetMore() || len(r.GetTasks()) == 0 || req.GetLimit() > 0 && len(out) >= int(req.GetLimit()) {
			return out, nil
		}
		last := out[len(out)-1].GetId()
		if req.GetOldestFirst() {
			page.AfterId = last
		} else {
			page.BeforeId = last
		}
	}
}

// Tasks iterates over the tasks req selects, newest first
// (req.OldestFirst: oldest first), page after page from req's cursor
// (BeforeId, AfterId) on, holding one page at a time; req.Limit is the
// page size (0: the server's). It stops at the first error, which it
// yields; a caller that stops early continues later with the last task's
// id as the cursor.
func (c *Client) Tasks(ctx context.Context, req *walcastv1.ListTasksRequest) iter.Seq2[*walcastv1.Task, error] {
	if req == nil {
		req = &walcastv1.ListTasksRequest{}
	}
	page := proto.CloneOf(req)
	return func(yield func(*walcastv1.Task, error) bool) {
		for {
			r, err := c.ListTasksPage(ctx, page)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, t := range r.GetTasks() {
				if !yield(t, nil) {
					return
				}
			}
			if !r.GetMore() || len(r.GetTasks()) == 0 {
				return
			}
			last := r.GetTasks()[len(r.GetTasks())-1].GetId()
			if page.GetOldestFirst() {
				page.AfterId = last
			} else {
				page.BeforeId = last
			}
		}
	}
}

// ListTasksPage asks for one page of tasks: the server caps it, and sets
// More when further tasks match (ask again with the last task's id as
// BeforeId, or AfterId when OldestFirst).
func (c *Client) ListTasksPage(ctx context.Context, req *walcastv1.ListTasksRequest) (*walcastv1.ListTasksResponse, error) {
	if req == nil {
		req = &walcastv1.ListTasksRequest{}
	}
	return unary(ctx, c, req, walcastv1connect.BroadcastServiceClient.ListTasks)
}

// ForceAck acks copies of a live task for consumers that are gone (admin;
// the server audits it with reason) and returns the task as it is then.
// Acks are idempotent, so the call is retried like a read.
func (c *Client) ForceAck(ctx context.Context, id uint64, vchannels []string, reason string) (*walcastv1.Task, error) {
	r, err := unary(ctx, c, &walcastv1.ForceAckRequest{Id: id, Vchannels: vchannels, Reason: reason},
		walcastv1connect.BroadcastServiceClient.ForceAck)
	return r.GetTask(), err
}

// ListTypes lists the message types the coordinator accepts.
func (c *Client) ListTypes(ctx context.Context) ([]*walcastv1.MessageType, error) {
	r, err := unary(ctx, c, &walcastv1.ListTypesRequest{}, walcastv1connect.BroadcastServiceClient.ListTypes)
	return r.GetTypes(), err
}

// ListLocks shows held and awaited resource keys.
func (c *Client) ListLocks(ctx context.Context) ([]*walcastv1.LockState, error) {
	r, err := unary(ctx, c, &walcastv1.ListLocksRequest{}, walcastv1connect.BroadcastServiceClient.ListLocks)
	return r.GetLocks(), err
}

// LookupKey reports the original of an idempotency key and its window, or
// an error matching ErrNotFound.
func (c *Client) LookupKey(ctx context.Context, t message.Type, key message.IdempotencyKey) (*walcastv1.LookupKeyResponse, error) {
	return unary(ctx, c, &walcastv1.LookupKeyRequest{Type: t.String(), IdempotencyKey: string(key)},
		walcastv1connect.BroadcastServiceClient.LookupKey)
}

// ListKeysPage reads one page of the remembered idempotency keys, in the
// order of their originals' broadcast ids (req.Limit: at most this many,
// 0: the server's page). A page may hold fewer keys than asked for, even
// none: go on while NextPageToken is set.
func (c *Client) ListKeysPage(ctx context.Context, req *walcastv1.ListKeysRequest) (*walcastv1.ListKeysResponse, error) {
	if req == nil {
		req = &walcastv1.ListKeysRequest{}
	}
	return unary(ctx, c, req, walcastv1connect.BroadcastServiceClient.ListKeys)
}

// Keys iterates over the remembered idempotency keys by their originals'
// broadcast ids, a page at a time (pageSize keys a page at most, 0: the
// server's); it stops at the first error, which it yields.
func (c *Client) Keys(ctx context.Context, pageSize int32) iter.Seq2[*walcastv1.KeyEntry, error] {
	return pages(func(token string) ([]*walcastv1.KeyEntry, string, error) {
		r, err := c.ListKeysPage(ctx, &walcastv1.ListKeysRequest{Limit: pageSize, PageToken: token})
		return r.GetKeys(), r.GetNextPageToken(), err
	})
}

// RetryCallback makes a failing callback retry now.
func (c *Client) RetryCallback(ctx context.Context, id uint64) error {
	_, err := unary(ctx, c, &walcastv1.RetryCallbackRequest{Id: id}, walcastv1connect.BroadcastServiceClient.RetryCallback)
	return err
}

// CompleteCallback completes a stuck callback without its effects, recording
// reason as the task's outcome. A retry of an attempt that did complete it
// finds the task finished and fails with ErrFailedPrecondition; GetTask
// tells whether it was this reason that completed it.
func (c *Client) CompleteCallback(ctx context.Context, id uint64, reason string) error {
	_, err := unary(ctx, c, &walcastv1.CompleteCallbackRequest{Id: id, Reason: reason},
		walcastv1connect.BroadcastServiceClient.CompleteCallback)
	return err
}
