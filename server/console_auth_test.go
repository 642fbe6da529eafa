package server_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestR9_9_ConsoleHonoursAPIAuth: with the API's authentication on, the
// console needs credentials (401 without), reads need reader (a node's
// credentials get 403), and the actions admin.
func TestR9_9_ConsoleHonoursAPIAuth(t *testing.T) {
	e := startSecure(t)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.roots}}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, token string, form url.Values) (int, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, _ := http.NewRequest(method, e.base+path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("GET", "/ui/tasks", "", nil); code != http.StatusUnauthorized || !strings.Contains(body, "not authenticated") {
		t.Errorf("no credentials: %d %.200s", code, body)
	}
	if code, _ := do("GET", "/ui/tasks", e.tokens["revoked"], nil); code != http.StatusUnauthorized {
		t.Errorf("a revoked token: %d", code)
	}
	if code, _ := do("GET", "/ui/tasks", e.tokens["node"], nil); code != http.StatusForbidden {
		t.Errorf("a node's token: %d, want 403", code)
	}
	code, body := do("GET", "/ui/", e.tokens["reader"], nil)
	if code != http.StatusOK || !strings.Contains(body, "reader_user (reader)") {
		t.Errorf("a reader: %d %.300s", code, body)
	}
	if code, body := do("POST", "/ui/tasks/1/retry", e.tokens["reader"], url.Values{"csrf": {"x"}}); code != http.StatusForbidden || !strings.Contains(body, "needs admin") {
		t.Errorf("a reader's retry: %d %.300s", code, body)
	}
	if code, body := do("POST", "/ui/tasks/1/retry", e.tokens["writer"], url.Values{"csrf": {"x"}}); code != http.StatusForbidden {
		t.Errorf("a writer's retry: %d %.300s", code, body)
	}
	if code, body := do("GET", "/ui/", e.tokens["admin"], nil); code != http.StatusOK || !strings.Contains(body, "admin_user (admin)") {
		t.Errorf("an admin: %d %.300s", code, body)
	}
}
