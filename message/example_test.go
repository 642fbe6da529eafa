package message_test

import (
	"fmt"

	"github.com/walcast/walcast/message"
)

// ExampleNewBroadcast builds a broadcast message with a collection-scoped
// idempotency key: the control channel is added when the broadcaster stamps
// it, and a duplicate target is refused.
func ExampleNewBroadcast() {
	typ := message.Type{Name: "Import", Version: 1}
	key := message.CollectionKey(42, "import-2026-12-01")
	m, err := message.NewBroadcast(typ, []byte(`{"files":["a.jsonl"]}`), []message.VChannel{"wal-1/c42v0", "wal-2/c42v1"},
		message.WithIdempotencyKey(key))
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Type, m.Broadcast.VChannels, m.IdempotencyKey)
	_, err = message.NewBroadcast(typ, nil, []message.VChannel{"wal-1/a", "wal-1/a"})
	fmt.Println(err)
	// Output:
	// Import.v1 [wal-1/c42v0 wal-2/c42v1] 3:42:import-2026-12-01
	// message: duplicate vchannel: wal-1/a
}

// ExampleScopedKey makes the same key as CollectionKey from a scope read at
// run time; a scope that does not exist is refused.
func ExampleScopedKey() {
	k, err := message.ScopedKey(message.ScopeCollection, 42, "import-2026-12-01")
	fmt.Println(k, err, k.Fingerprint() == message.CollectionKey(42, "import-2026-12-01").Fingerprint())
	_, err = message.ScopedKey(message.ScopeCluster, 5, "k")
	fmt.Println(err != nil)
	// Output:
	// 3:42:import-2026-12-01 <nil> true
	// true
}
