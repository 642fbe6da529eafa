package console

import (
	"bytes"
	"crypto/sha256"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// heartbeat is how often an idle events stream sends a comment, so proxies
// keep it open and a dead client is noticed.
const heartbeat = 15 * time.Second

// livePage resolves a page URL of the console to its name and handler, and
// sets the path values its handler reads.
func (c *Console) livePage(u *url.URL, r *http.Request) (string, func(*request) (view, error), bool) {
	switch p := u.Path; {
	case p == Prefix:
		return "overview", c.overview, true
	case p == Prefix+"tasks":
		return "tasks", c.tasks, true
	case strings.HasPrefix(p, Prefix+"tasks/") && !strings.Contains(p[len(Prefix+"tasks/"):], "/"):
		r.SetPathValue("id", p[len(Prefix+"tasks/"):])
		return "task", c.task, true
	case p == Prefix+"locks":
		return "locks", c.locks, true
	case p == Prefix+"keys":
		return "keys", c.keys, true
	case p == Prefix+"imports":
		return "imports", c.imports, true
	case p == Prefix+"collections":
		return "collections", c.collections, true
	case p == Prefix+"replication":
		return "replication", c.replication, true
	}
	return "", nil, false
}

// events streams a page's live region as server-sent events: an "update"
// event with the region's HTML whenever it changed (checked every
// Config.Interval), and "gone" when the page cannot be rendered any more
// (the task vanished, the coordinator stepped down): the script then
// reloads the whole page.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	who, err := c.authorize(r, RoleReader)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	raw := r.URL.Query().Get("page")
	u, err := url.Parse(raw)
	if err != nil || raw == "" || u.IsAbs() || u.Host != "" {
		c.fail(w, r, badRequest("page %q is not a console page", clean(raw)))
		return
	}
	pr := r.Clone(r.Context())
	pr.URL = u
	pr.RequestURI = u.RequestURI()
	name, fn, ok := c.livePage(u, pr)
	if !ok {
		c.fail(w, r, badRequest("page %q is not a console page with live updates", clean(raw)))
		return
	}
	select {
	case <-c.done:
		c.fail(w, r, &httpError{code: http.StatusServiceUnavailable, msg: "the console is shutting down"})
		return
	default:
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		c.fail(w, r, &httpError{code: http.StatusNotImplemented, msg: "streaming is not supported here"})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("retry: 2000\n\n"))
	fl.Flush()
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	var last [sha256.Size]byte
	idle := time.Now()
	for {
		body, code := c.render(name, fn, pr, who, true)
		switch sum := sha256.Sum256(body); {
		case code != http.StatusOK:
			_, _ = w.Write([]byte("event: gone\ndata: \n\n"))
			fl.Flush()
			return
		case sum != last:
			last = sum
			if err := writeEvent(w, "update", body); err != nil {
				return
			}
			fl.Flush()
			idle = time.Now()
		case time.Since(idle) > heartbeat:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			fl.Flush()
			idle = time.Now()
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.done:
			return
		case <-tick.C:
		}
	}
}

// writeEvent writes one event; every line of data gets its "data:" prefix
// (the client joins them with newlines).
func writeEvent(w http.ResponseWriter, event string, data []byte) error {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteByte('\n')
	for _, line := range bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n")) {
		b.WriteString("data: ")
		b.Write(bytes.TrimSuffix(line, []byte("\r")))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}
