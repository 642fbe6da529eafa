package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server/apitest"
)

// TestR7_1_MalformedKeysRefusedThroughTheAPI: scoped idempotency keys of an
// unregistered domain or with a scope id their domain does not allow, and
// resource keys without the name their domain needs, with trailing garbage,
// or naming the Cluster key, are refused with InvalidArgument over every
// protocol, and nothing is persisted, appended or locked.
func TestR7_1_MalformedKeysRefusedThroughTheAPI(t *testing.T) {
	forProtocols(t, func(t *testing.T, p protocol) {
		env := apitest.New(t)
		b := env.Open()
		c := dial(t, apitest.Serve(t, app.StaticLeader(b), nil), p)
		ctx := ctxT(t)
		for _, tc := range []struct {
			name string
			mod  func(r *walcastv1.BroadcastRequest)
			says string
		}{
			{"idempotency key of an unregistered domain", func(r *walcastv1.BroadcastRequest) { r.IdempotencyKey = "4:0:x" },
				"scope domain 4 is not registered"},
			{"cluster idempotency key with scope id 5", func(r *walcastv1.BroadcastRequest) { r.IdempotencyKey = "1:5:x" },
				"the cluster scope domain has one scope, id 0; got 5"},
			{"collection idempotency key with scope id 0", func(r *walcastv1.BroadcastRequest) { r.IdempotencyKey = "3:0:x" },
				"collection scope ids start at 1"},
			{"collection key without a name", func(r *walcastv1.BroadcastRequest) { r.ResourceKeys = []string{"Collection:@X"} },
				"Collection key without a name"},
			{"database key with trailing garbage", func(r *walcastv1.BroadcastRequest) { r.ResourceKeys = []string{"Database:a@R@X"} },
				`mode "R@X" is neither R nor X`},
			{"named cluster key", func(r *walcastv1.BroadcastRequest) { r.ResourceKeys = []string{"Cluster:foo@R"} },
				"the Cluster domain has one key"},
			{"key name with a control character", func(r *walcastv1.BroadcastRequest) { r.ResourceKeys = []string{"Database:a\x01b@R"} },
				"control character"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := snap(env, b)
				r := newReq()
				tc.mod(r)
				_, err := c.Broadcast(ctx, connect.NewRequest(r))
				ce := wantCode(t, err, connect.CodeInvalidArgument)
				if !strings.Contains(ce.Message(), tc.says) {
					t.Errorf("message %q does not say %q", ce.Message(), tc.says)
				}
				if after := snap(env, b); !after.equal(before) {
					t.Errorf("state changed: before %+v, after %+v", before, after)
				}
			})
		}
		// LookupKey refuses the same keys.
		for _, k := range []string{"4:0:x", "1:5:x"} {
			_, err := c.LookupKey(ctx, connect.NewRequest(&walcastv1.LookupKeyRequest{Type: apitest.Create.String(), IdempotencyKey: k}))
			wantCode(t, err, connect.CodeInvalidArgument)
		}
	})
}

// TestR9_4_UnknownJSONFieldRefused: a JSON request with a field the message
// does not have — a misspelt idempotency_key — is refused with
// InvalidArgument (HTTP 400) instead of running as if the key were absent,
// which would make a retried request non-idempotent; nothing is persisted.
// The same request spelt right runs, and a retry of it is a duplicate.
func TestR9_4_UnknownJSONFieldRefused(t *testing.T) {
	env := apitest.New(t)
	b := env.Open()
	srv := apitest.Serve(t, app.StaticLeader(b), nil)
	hc := apitest.HTTPClient(t, false)
	url := srv.URL + "/walcast.api.v1.BroadcastService/Broadcast"
	body := func(keyField string) []byte {
		r := newReq()
		raw, err := protojson.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		m[keyField] = string(message.ClusterKey("retry-me"))
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	post := func(b []byte, contentType string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, url, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	for _, ct := range []string{"application/json", "application/json; charset=utf-8"} {
		for _, field := range []string{"idempotency_kye", "idempotencyKye", "resource_key"} {
			before := snap(env, b)
			status, out := post(body(field), ct)
			if status != http.StatusBadRequest || !strings.Contains(out, `"invalid_argument"`) || !strings.Contains(out, field) {
				t.Fatalf("%s with %q: %d %s, want 400 invalid_argument naming the field", ct, field, status, out)
			}
			if after := snap(env, b); !after.equal(before) {
				t.Fatalf("%s with %q: state changed: before %+v, after %+v", ct, field, before, after)
			}
		}
	}
	// Spelt right (both JSON spellings of the field), the key is honoured.
	for i, field := range []string{"idempotency_key", "idempotencyKey"} {
		status, out := post(body(field), "application/json")
		if status != http.StatusOK {
			t.Fatalf("%s: %d %s", field, status, out)
		}
		if dup := strings.Contains(out, `"duplicated":true`); dup != (i == 1) {
			t.Fatalf("%s: duplicate=%v, want %v: %s", field, dup, i == 1, out)
		}
	}
}
