// Package message is walcast's model of control messages, the channels they go
// to, and the idempotency keys that make client retries safe.
//
// # Channels
//
// A [PChannel] is a physical WAL partition; appends to it are totally ordered.
// A [VChannel] is a virtual channel hosted on exactly one pchannel and is
// written "<pchannel>/<name>", so every copy knows where it is appended. The
// control channel of pchannel p is p.Control() ("p/_control"); one of them is
// the cluster's control channel, and every broadcast goes to it too.
//
// # Types
//
// A message has a [Type] (name and version) registered in a [Registry] with
// its properties (SPEC R2.5): whether it must be appended alone, whether it is
// replicated to secondaries, whether it waits for consumer acks (AckSyncUp),
// and an optional payload validator.
//
// # The life of a broadcast message
//
//	msg, err := message.NewBroadcast(createIndex, payload,          // 1. build: targets checked,
//		[]message.VChannel{"wal-0/c7v0", "wal-1/c7v1"},             //    duplicates rejected
//		message.WithIdempotencyKey(message.CollectionKey(7, "req-1")))
//	stamped, err := msg.Stamp(id, controlChannel, heldKeys)        // 2. the broadcaster stamps it:
//	                                                                //    id, control channel, keys
//	copies, err := stamped.Split()                                  // 3. one Copy per vchannel
//
// Building and splitting return typed errors ([ErrNoTargets],
// [ErrDuplicateVChannel], [ErrUnstamped], ...) instead of panicking, because
// their input comes from users. A stamped message is immutable: its copies
// share it.
//
// # Idempotency keys
//
// An [IdempotencyKey] binds a client's retry key to a scope: the cluster, a
// database id, a collection id, or an application domain. It is encoded
// "<domain>:<scopeID>:<clientKey>"; the client key is the unbounded tail, and
// the two leading fields are canonical decimals, so a crafted client key
// containing ':' cannot impersonate another scope (a fuzz test checks that
// every string that parses is exactly what the constructors would print for
// its parts). The domain must be registered (the built-in cluster, database
// and collection domains, or one an application adds with
// [RegisterScopeDomain]) and the scope id one the domain allows: the cluster
// has only scope 0, databases and collections are numbered from 1, so
// "4:0:x" and "1:5:x" are invalid keys rather than scopes of their own. An
// empty client key yields the empty key, which means "not idempotent". Keys
// are never logged raw: use [IdempotencyKey.Fingerprint].
//
// Requirement ids (SPEC R2.5, R3.2, ...) refer to docs/spec.md, walcast's
// specification, in the repository.
package message
