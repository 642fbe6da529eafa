package console_test

import (
	"context"
	"html"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/server/console"
)

// TestR9_9_CollectionsPagePagesForwardAndBack: the collections page shows
// one page of a database's collections, asking the application for that
// page alone, and links to the next, the previous and the first page; the
// previous link of any page leads back to the page before it. Names are
// escaped; a page token or a history beyond the bounds is a 400.
func TestR9_9_CollectionsPagePagesForwardAndBack(t *testing.T) {
	names := []string{"c0", "c1", "c2", "c3", "c4", evil}
	var mu sync.Mutex
	var asked []string // the tokens asked for, one per render
	f := newFixture(t, func(cfg *console.Config) {
		cfg.Collections = func(_ context.Context, db, token string) ([]*walcastv1.Collection, string, error) {
			mu.Lock()
			asked = append(asked, token)
			mu.Unlock()
			if db != "shop" {
				return nil, "", nil
			}
			i := 0
			if token != "" {
				i = slices.Index(names, token) + 1
			}
			end := min(i+2, len(names))
			var page []*walcastv1.Collection
			for _, n := range names[i:end] {
				page = append(page, &walcastv1.Collection{Database: db, Name: n, Shards: 1, Vchannels: []string{"wal-0/" + n}})
			}
			next := ""
			if end < len(names) {
				next = names[end-1]
			}
			return page, next, nil
		}
	})
	shows := func(body string, want ...string) {
		t.Helper()
		for _, n := range names {
			if slices.Contains(want, n) != strings.Contains(body, "<td>"+n+"</td>") {
				t.Fatalf("page shows %s: %v, want only %v:\n%s", n, !slices.Contains(want, n), want, body)
			}
		}
	}
	link := func(body, id string) string {
		t.Helper()
		m := regexp.MustCompile(`id="` + id + `" href="([^"]+)"`).FindStringSubmatch(body)
		if m == nil {
			return ""
		}
		return html.UnescapeString(m[1])
	}
	get := func(path string) string {
		t.Helper()
		mu.Lock()
		before := len(asked)
		mu.Unlock()
		code, body := f.get(path)
		if code != 200 {
			t.Fatalf("%s: %d\n%s", path, code, body)
		}
		mu.Lock()
		if n := len(asked) - before; n != 1 {
			t.Errorf("%s: %d pages asked for, want 1", path, n)
		}
		mu.Unlock()
		return body
	}

	if _, body := f.get("/ui/collections"); !strings.Contains(body, "Name a database") {
		t.Fatalf("the page without a database:\n%s", body)
	}
	first := get("/ui/collections?db=shop")
	shows(first, "c0", "c1")
	if link(first, "prev") != "" {
		t.Errorf("the first page links a previous one")
	}
	var pages []string // the URL of each page, from the second
	for body := first; link(body, "next") != ""; {
		u := link(body, "next")
		pages = append(pages, u)
		body = get(u)
	}
	if len(pages) != 2 {
		t.Fatalf("%d pages after the first, want 2: %v", len(pages), pages)
	}
	second, third := get(pages[0]), get(pages[1])
	shows(second, "c2", "c3")
	if !strings.Contains(third, "<td>c4</td>") || !strings.Contains(third, "&lt;script&gt;alert(1)") || strings.Contains(third, "<script>alert") {
		t.Fatalf("the last page does not show c4 and the escaped name:\n%s", third)
	}
	if link(third, "next") != "" {
		t.Errorf("the last page links a next one")
	}
	if p := link(third, "prev"); p != pages[0] {
		t.Errorf("the last page's previous link %q, want the second page %q", p, pages[0])
	}
	shows(get(link(second, "prev")), "c0", "c1")

	long := strings.Repeat("x", 1025)
	tooMany := url.Values{"db": {"shop"}, "page": {"c1"}, "back": slices.Repeat([]string{"c1"}, 9)}
	for _, p := range []string{"/ui/collections?db=shop&page=" + long, "/ui/collections?" + tooMany.Encode(),
		"/ui/collections?db=" + strings.Repeat("d", 129)} {
		if code, _ := f.get(p); code != 400 {
			t.Errorf("%.60s...: %d, want 400", p, code)
		}
	}
}
