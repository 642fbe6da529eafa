package server_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// TestR9_4_OversizeRequestIsASizeError: a request over the API's size limit
// (10 MB against 1 MiB) is refused as invalid_argument with the reason
// REQUEST_TOO_LARGE, over Connect, gRPC and plain JSON over HTTP, compressed
// or not — never resource_exhausted (HTTP 429, "retry later"), which a
// client would retry. A request of the limit's size still passes.
func TestR9_4_OversizeRequestIsASizeError(t *testing.T) {
	env := apitest.New(t)
	b := env.Open(func(cfg *broadcast.Config) { cfg.PChannels = apitest.PChannels })
	srv := apitest.Serve(t, app.StaticLeader(b), nil, server.WithMaxRequestBytes(1<<20))
	big := &walcastv1.BroadcastRequest{Type: apitest.Create.String(), Payload: make([]byte, 10<<20), Vchannels: []string{"wal-1/a"}}
	// Compressed: 2 MiB that do not compress (gzip of 10 MB is slow
	// under the race detector).
	noise := make([]byte, 2<<20)
	_, _ = rand.Read(noise)
	bigZ := &walcastv1.BroadcastRequest{Type: apitest.Create.String(), Payload: noise, Vchannels: []string{"wal-1/a"}}
	for _, p := range append(protocols,
		protocol{name: "connect-gzip", opts: []connect.ClientOption{connect.WithSendGzip()}},
		protocol{name: "grpc-gzip", h2: true, opts: []connect.ClientOption{connect.WithGRPC(), connect.WithSendGzip()}}) {
		t.Run(p.name, func(t *testing.T) {
			req := big
			if strings.HasSuffix(p.name, "gzip") {
				req = bigZ
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := dial(t, srv, p).Broadcast(ctx, connect.NewRequest(req))
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if reason, _ := reasonOf(ce); !strings.Contains(ce.Message(), "request too large") || reason != server.ReasonRequestTooLarge {
				t.Errorf("oversize request: %v (reason %q)", ce, reason)
			}
		})
	}
	t.Run("http-json", func(t *testing.T) {
		body := `{"type":"CreateCollection.v1","vchannels":["wal-1/a"],"payload":"` + strings.Repeat("A", 10<<20) + `"}`
		resp, err := http.Post(srv.URL+"/walcast.api.v1.BroadcastService/Broadcast", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(out), `"code":"invalid_argument"`) {
			t.Errorf("10 MB of JSON: %s %s", resp.Status, out)
		}
	})
	t.Run("gzip-bomb", func(t *testing.T) {
		// Small on the wire, over the limit once decompressed.
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		_, _ = zw.Write([]byte(`{"type":"CreateCollection.v1","vchannels":["wal-1/a"],"payload":"` + strings.Repeat("A", 4<<20) + `"}`))
		_ = zw.Close()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/walcast.api.v1.BroadcastService/Broadcast", &z)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(out), "request too large") {
			t.Errorf("a gzip bomb: %s %s", resp.Status, out)
		}
	})
	t.Run("within the limit", func(t *testing.T) {
		ok := &walcastv1.BroadcastRequest{Type: apitest.Create.String(), Payload: make([]byte, 200<<10), Vchannels: []string{"wal-1/a"}}
		if _, err := dial(t, srv, protocols[0]).Broadcast(ctxT(t), connect.NewRequest(ok)); err != nil {
			t.Errorf("a request under the limit: %v", err)
		}
	})
}
