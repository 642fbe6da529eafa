package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"

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
	// NoWait fails at once with an error matching ErrBusy (naming the
	// holder: Error.Holder) instead of queueing for a resource key held in
	// a conflicting mode (R13.15). Nothing is created then.
	NoWait bool
	// Unreplicable makes the broadcast local-only (R13.13): it goes to
	// this cluster's WAL only, no replicator copies it, and a secondary
	// accepts it too.
	Unreplicable bool
	// Copies gives targets a role or a payload of their own (R13.10); each
	// must be one of VChannels.
	Copies map[message.VChannel]Copy
	// AppendFirst names targets whose copies are appended, and acked by
	// their consumers, before the others (the control channel's included)
	// are appended (R13.11). WaitVChannelsAcked waits for such a phase.
	AppendFirst []message.VChannel
}

// Copy is what one target's copy carries beside the broadcast's own
// (R13.10).
type Copy struct {
	// Role is a short word for the consumer ("fence", "genesis"), at most
	// 64 bytes.
	Role string
	// Payload, if not nil, replaces the broadcast's payload in this copy
	// (an empty, non-nil slice: an empty payload).
	Payload []byte
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
	// Extras are what consumers returned with their acks (R13.12), by
	// vchannel; nil if none did.
	Extras map[message.VChannel][]byte
}

// Broadcast sends a broadcast and returns once its callback has run, or with
// the original's result for a repeated key. See the package documentation
// for which failures it retries.
func (c *Client) Broadcast(ctx context.Context, req *BroadcastRequest) (*BroadcastResult, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	key, err := scopedKey(req.Scope, &req.ClientKey)
	if err != nil {
		return nil, err
	}
	pb := &walcastv1.BroadcastRequest{
		Type:           typeName(req.Type),
		Payload:        req.Payload,
		IdempotencyKey: string(key),
		AckSyncUp:      req.AckSyncUp,
		Properties:     req.Properties,
		RequestDigest:  req.RequestDigest,
		NoWait:         req.NoWait,
		Unreplicable:   req.Unreplicable,
		Vchannels:      strs(req.VChannels),
		ResourceKeys:   keyStrs(req.ResourceKeys),
		AppendFirst:    strs(req.AppendFirst),
	}
	if len(req.Copies) > 0 {
		pb.Copies = make(map[string]*walcastv1.TargetCopy, len(req.Copies))
		for v, cp := range req.Copies {
			pb.Copies[string(v)] = &walcastv1.TargetCopy{Role: cp.Role, Payload: cp.Payload}
		}
	}
	var resp *walcastv1.BroadcastResponse
	n, err := c.call(ctx, policyOf(key), func(ctx context.Context, e *endpoint) error {
		r, err := e.broadcast.Broadcast(ctx, connect.NewRequest(pb))
		if err == nil {
			resp = r.Msg
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return resultOf(resp, key, n), nil
}

// typeName is t.String() ("<name>.v<version>") without the fmt.Sprintf that
// costs every request three allocations.
func typeName(t message.Type) string {
	return t.Name + ".v" + strconv.FormatUint(uint64(t.Version), 10)
}

// scopedKey returns the idempotency key of scope and *clientKey, minting
// the client key if scope is set without one (and storing it there); ""
// for no scope.
func scopedKey(scope Scope, clientKey *string) (message.IdempotencyKey, error) {
	switch {
	case scope != (Scope{}):
		if *clientKey == "" {
			*clientKey = NewRequestKey()
		}
		k, err := message.ScopedKey(scope.Domain, scope.ID, *clientKey)
		if err != nil {
			return "", invalidRequest("scope: %v", err)
		}
		return k, nil
	case *clientKey != "":
		return "", invalidRequest("a client key needs a scope")
	}
	return "", nil
}

// policyOf is the retry policy of a broadcast with key: a keyed one is
// answered by its original when repeated.
func policyOf(key message.IdempotencyKey) policy {
	if key != "" {
		return anyTransient
	}
	return ifNotRun
}

func strs[S ~string](vs []S) []string {
	if len(vs) == 0 {
		return nil
	}
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

func keyStrs(ks []resource.Key) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.String()
	}
	return out
}

// resultOf is the client's form of a broadcast's response.
func resultOf(resp *walcastv1.BroadcastResponse, key message.IdempotencyKey, attempts int) *BroadcastResult {
	res := &BroadcastResult{
		BroadcastID:    resp.GetBroadcastId(),
		Appends:        make(map[message.VChannel]*walcastv1.Checkpoint, len(resp.GetAppends())),
		Duplicated:     resp.GetDuplicated(),
		Outcome:        resp.GetOutcome(),
		Window:         resp.GetWindow(),
		IdempotencyKey: key,
		Attempts:       attempts,
	}
	for v, cp := range resp.GetAppends() {
		res.Appends[message.VChannel(v)] = cp
	}
	if len(resp.GetExtras()) > 0 {
		res.Extras = make(map[message.VChannel][]byte, len(resp.GetExtras()))
		for v, x := range resp.GetExtras() {
			res.Extras[message.VChannel(v)] = x
		}
	}
	return res
}
