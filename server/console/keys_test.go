package console_test

import (
	"context"
	"fmt"
	"html"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server/apitest"
	"github.com/walcast/walcast/server/console"
)

// TestR7_5_KeysPagePagesForwardAndBack: the keys page lists one page of
// the remembered idempotency keys by their originals' ids, by scope and
// fingerprint (never the raw key), and links to the next, the previous and
// the first page; the previous link of any page leads back to the page
// before it. A cursor that is not an id, or a history beyond the bound, is
// a 400.
func TestR7_5_KeysPagePagesForwardAndBack(t *testing.T) {
	f := newFixture(t, nil)
	f.fail.Store(false) // the callbacks of the keys below succeed
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n := 2*console.DefaultPageSize + 3
	var ids []uint64
	for i := range n {
		k := message.CollectionKey(9, fmt.Sprint("secret-", i))
		h, err := f.b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: apitest.Create, Key: k}, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := message.NewBroadcast(apitest.Create, []byte("x"), []message.VChannel{"wal-1/a"}, message.WithIdempotencyKey(k))
		r, err := h.Broadcast(ctx, m)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.BroadcastID)
	}
	row := regexp.MustCompile(`<tr><td><a href="[^"]*">(\d+)</a></td><td>CreateCollection\.v1</td><td>collection:9</td><td><code>([0-9a-f]{32})</code></td>`)
	link := func(body, id string) string {
		m := regexp.MustCompile(`id="` + id + `" href="([^"]+)"`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return html.UnescapeString(m[1])
	}
	get := func(path string) (body string, listed []string) {
		t.Helper()
		code, body := f.get(path)
		if code != 200 {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
		if strings.Contains(body, "secret-") {
			t.Fatalf("%s shows a raw key", path)
		}
		for _, m := range row.FindAllStringSubmatch(body, -1) {
			listed = append(listed, m[1])
		}
		return body, listed
	}
	var all []string
	var pages []string
	body, listed := get("/ui/keys")
	if link(body, "prev") != "" {
		t.Errorf("the first page links a previous one")
	}
	first := listed
	for {
		all = append(all, listed...)
		u := link(body, "next")
		if u == "" {
			break
		}
		pages = append(pages, u)
		body, listed = get(u)
	}
	if fmt.Sprint(all) != fmt.Sprint(ids) || len(pages) != 2 {
		t.Fatalf("keys %v in %d pages after the first, want %v in 2:\n%s", all, len(pages), ids, body)
	}
	if p := link(body, "prev"); p != pages[0] {
		t.Errorf("the last page's previous link %q, want the second page %q", p, pages[0])
	}
	second, _ := get(pages[0])
	if _, back := get(link(second, "prev")); fmt.Sprint(back) != fmt.Sprint(first) {
		t.Errorf("the second page's previous link lists %v, want the first page %v", back, first)
	}
	for _, p := range []string{"/ui/keys?after=x", "/ui/keys?after=5&back=1&back=2&back=3&back=4&back=5&back=6&back=7&back=8&back=9",
		"/ui/keys?after=5&back=y"} {
		if code, _ := f.get(p); code != 400 {
			t.Errorf("%s: %d, want 400", p, code)
		}
	}
}
