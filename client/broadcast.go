package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// NewRequestKey returns a fresh client key: 128 random bits in hex. Mint one
// per logical operation and reuse it for every retry of that operation.
func NewRequestKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read panics instead)
	return hex.EncodeToString(b[:])
}

// Scope is what an idempotency key is scoped to (R7.1): a cluster, a
// database or a collection by id, or an application domain. The zero Scope
// means "not idempotent".
type Scope struct {
	Domain message.ScopeDomain
	ID     uint64
}

// ClusterScope scopes a key to the whole cluster.
func ClusterScope() Scope { return Scope{Domain: message.ScopeCluster} }

// DatabaseScope scopes a key to the database with id dbID.
func DatabaseScope(dbID uint64) Scope { return Scope{Domain: message.ScopeDatabase, ID: dbID} }

// CollectionScope scopes a key to the collection with id collectionID: by id,
// so a renamed collection keeps its keys and a recreated one does not.
func CollectionScope(collectionID uint64) Scope {
	return Scope{Domain: message.ScopeCollection, ID: collectionID}
}

// BroadcastRequest is one broadcast to send.
type BroadcastRequest struct {
	Type    message.Type
	Payload []byte
	// VChannels are the targets; the control channel is added by the server.
	VChannels    []message.VChannel
	ResourceKeys []resource.Key
	// Scope, if set, makes the broadcast idempotent: every attempt carries
	// the key (Scope, ClientKey), and the server answers a repeat with the
	// original's result.
	Scope Scope
	// ClientKey is the caller's key within Scope. If Scope is set and
	// ClientKey is empty, Broadcast mints one (NewRequestKey) before the
	// first attempt and stores it here, so a caller who repeats the
	// operation with this request reuses it. Set with an unset Scope, it is
	// an error.
	ClientKey  string
	AckSyncUp  bool
	Properties map[string]string
	// RequestDigest, if set, identifies the request on retries instead of
	// the payload: give it when the payload holds values allocated per
	// attempt.
	RequestDigest []byte
}

// BroadcastResult is the outcome of a broadcast.
type BroadcastResult struct {
	BroadcastID uint64
	// Appends says where each copy landed, control channel included.
	Appends map[message.VChannel]*walcastv1.Checkpoint
	// Duplicated is set when the request resolved to an earlier broadcast
	// with the same key (an earlier attempt, or an earlier call): nothing was
	// broadcast again, and the fields above are the original's.
	Duplicated bool
	// Outcome is what the (original's) callback recorded. A failed original
	// stays failed for this key: mint a new key to try again (R7.9).
	Outcome *walcastv1.Outcome
	// Window says how long the key is remembered (keyed broadcasts only).
	Window *walcastv1.Window
	// IdempotencyKey is the scoped key sent on every attempt, "" if none.
	// Log its Fingerprint, not the key.
	IdempotencyKey message.IdempotencyKey
	// Attempts counts the attempts made.
	Attempts int
}

// Broadcast sends a broadcast and returns once its callback has run, or with
// the original's result for a repeated key. See the package documentation
// for which failures it retries.
func (c *Client) Broadcast(ctx context.Context, req *BroadcastRequest) (*BroadcastResult, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	var key message.IdempotencyKey
	switch {
	case req.Scope != (Scope{}):
		if req.ClientKey == "" {
			req.ClientKey = NewRequestKey()
		}
		k, err := message.ScopedKey(req.Scope.Domain, req.Scope.ID, req.ClientKey)
		if err != nil {
			return nil, invalidRequest("scope: %v", err)
		}
		key = k
	case req.ClientKey != "":
		return nil, invalidRequest("a client key needs a scope")
	}
	pb := &walcastv1.BroadcastRequest{
		Type:           req.Type.String(),
		Payload:        req.Payload,
		Vchannels:      make([]string, len(req.VChannels)),
		ResourceKeys:   make([]string, len(req.ResourceKeys)),
		IdempotencyKey: string(key),
		AckSyncUp:      req.AckSyncUp,
		Properties:     req.Properties,
		RequestDigest:  req.RequestDigest,
	}
	for i, v := range req.VChannels {
		pb.Vchannels[i] = string(v)
	}
	for i, k := range req.ResourceKeys {
		pb.ResourceKeys[i] = k.String()
	}
	p := ifNotRun
	if key != "" {
		p = anyTransient
	}
	var resp *walcastv1.BroadcastResponse
	n, err := c.call(ctx, p, func(ctx context.Context, e *endpoint) error {
		r, err := e.broadcast.Broadcast(ctx, connect.NewRequest(pb))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	res := &BroadcastResult{
		BroadcastID:    resp.GetBroadcastId(),
		Appends:        make(map[message.VChannel]*walcastv1.Checkpoint, len(resp.GetAppends())),
		Duplicated:     resp.GetDuplicated(),
		Outcome:        resp.GetOutcome(),
		Window:         resp.GetWindow(),
		IdempotencyKey: key,
		Attempts:       n,
	}
	for v, cp := range resp.GetAppends() {
		res.Appends[message.VChannel(v)] = cp
	}
	return res, nil
}
