package broadcast_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/embedded"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Example embeds the engine on an embedded etcd (the catalog) and an
// embedded NATS JetStream server (the WAL): register a type and its ack
// callback, broadcast a message to two vchannels under resource keys, and
// get where each copy landed once the callback ran.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := os.MkdirTemp("", "walcast-example-")
	defer os.RemoveAll(dir)

	backends, err := embedded.Start(ctx, embedded.Config{Dir: dir})
	if err != nil {
		log.Fatal(err)
	}
	defer backends.Close()

	createCollection := message.Type{Name: "CreateCollection", Version: 1}
	types, callbacks := message.NewRegistry(), broadcast.NewCallbacks()
	types.MustRegister(message.TypeInfo{Type: createCollection})
	_ = broadcast.OnAck(callbacks, createCollection, broadcast.Raw(), func(_ context.Context, ev *broadcast.TypedEvent[[]byte]) error {
		fmt.Printf("callback: %s on %d vchannels\n", ev.Payload, len(ev.Results))
		return nil // the collection takes effect here, once every copy is acked
	})
	cfg := backends.BroadcastConfig(types, callbacks)
	cfg.Logger = slog.New(slog.DiscardHandler)
	b, err := broadcast.New(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	h, err := b.WithResourceKeys(ctx, resource.SharedDatabase("shop"), resource.ExclusiveCollection("shop", "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	msg, err := message.NewBroadcast(createCollection, []byte("shop.orders"), []message.VChannel{"wal-1/c1v0", "wal-2/c1v1"})
	if err != nil {
		log.Fatal(err)
	}
	res, err := h.Broadcast(ctx, msg)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("broadcast %d %s, %d copies (the control channel's included)\n", res.BroadcastID, res.Outcome.Status, len(res.Appends))
	// Output:
	// callback: shop.orders on 3 vchannels
	// broadcast 1 succeeded, 3 copies (the control channel's included)
}
