package client_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// TestQuotaExceededSaysWhenToRetry: a call refused by the coordinator's
// admission (ResourceExhausted, QUOTA_EXCEEDED, with a RetryInfo as the
// server's admission sends it) comes back after one attempt as
// ErrQuotaExceeded whose RetryAfter is the server's delay, for the caller
// to retry with the same key; an error without a RetryInfo has none.
func TestQuotaExceededSaysWhenToRetry(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		var hits atomic.Int64
		var delay atomic.Int64 // the RetryInfo to send; 0: none
		refuse := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				ce := connect.NewError(connect.CodeResourceExhausted, errors.New("quota exceeded: the coordinator is overloaded"))
				if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: server.ReasonQuotaExceeded, Domain: server.ErrorDomain}); err == nil {
					ce.AddDetail(d)
				}
				if n := delay.Load(); n > 0 {
					if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(n))}); err == nil {
						ce.AddDetail(d)
					}
				}
				connect.NewErrorWriter().Write(w, r, ce)
			})
		}
		srv := apitest.Serve(t, app.StaticLeader(env.Open()), refuse)
		c := newClient(t, p, []string{srv.URL})
		ctx := ctxT(t)
		for _, want := range []time.Duration{3 * time.Second, 0} {
			delay.Store(int64(want))
			before := hits.Load()
			req := newReq()
			req.Scope = client.CollectionScope(3)
			_, err := c.Broadcast(ctx, req)
			var ce *client.Error
			if !errors.Is(err, client.ErrQuotaExceeded) || !errors.As(err, &ce) {
				t.Fatalf("refused call: %v, want ErrQuotaExceeded", err)
			}
			if ce.RetryAfter != want || ce.Attempts != 1 || hits.Load()-before != 1 {
				t.Fatalf("RetryAfter %v after %d attempts (%d requests), want %v after 1", ce.RetryAfter, ce.Attempts, hits.Load()-before, want)
			}
		}
	})
}
