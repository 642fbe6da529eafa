package console

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"html/template"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/tracing"
)

// Paging bounds of the tasks page.
const (
	DefaultPageSize = 50
	MaxPageSize     = 500
)

// maxAge bounds age filters: larger values are typos.
const maxAge = 10 * 365 * 24 * time.Hour

// clean makes s safe and legible to show: control characters become \xNN
// (or \uNNNN) escapes and invalid UTF-8 becomes U+FFFD, before html/template
// escapes the markup characters.
func clean(s string) string {
	ok := true
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError || r == 0x2028 || r == 0x2029 {
			ok = false
			break
		}
	}
	if ok {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == utf8.RuneError:
			b.WriteRune('\uFFFD')
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (c *Console) funcs() template.FuncMap {
	return template.FuncMap{
		"clean": func(v any) string { return clean(fmt.Sprint(v)) },
		"ago": func(t time.Time) string {
			if t.IsZero() || t.UnixNano() == 0 {
				return "-"
			}
			return age(c.cfg.Clock().Sub(t))
		},
		"when": func(t time.Time) string {
			if t.IsZero() || t.UnixNano() == 0 {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05.000")
		},
		"dur":  func(d time.Duration) string { return age(d) },
		"task": func(id uint64) string { return Prefix + "tasks/" + strconv.FormatUint(id, 10) },
		// word is an API enum as a word: IMPORT_JOB_STATE_COMPLETED as
		// "completed" (its type's prefix dropped, lower case, spaces).
		"word": enumWord,
		"pct": func(a, b int) int {
			if b == 0 {
				return 0
			}
			return a * 100 / b
		},
		"pct64": func(a, b uint64) uint64 {
			if b == 0 {
				return 0
			}
			return min(a, b) * 100 / b
		},
	}
}

// enumWord turns a protobuf enum's name into the word people read:
// IMPORT_JOB_STATE_COMPLETED is "completed", OUTCOME_STATUS_FAILED "failed"
// (the prefix is the enum type's name in upper snake case).
func enumWord(v interface {
	String() string
	Descriptor() protoreflect.EnumDescriptor
}) string {
	name := v.String()
	var b strings.Builder
	for i, r := range string(v.Descriptor().Name()) {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	name = strings.TrimPrefix(name, b.String()+"_")
	return strings.ReplaceAll(strings.ToLower(name), "_", " ")
}

// age formats a duration for humans: 850ms, 12s, 3m12s, 5h03m, 2d04h.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// ---- overview

// nodeRow is one pchannel of a streaming node: what the leader knows from
// its acks, and, for a node in this process, its own status.
type nodeRow struct {
	Name     string
	PChannel string
	// Acked says the leader took acks of the node on the pchannel: when
	// the last came (AckAge ago), its position, how many.
	Acked    bool
	AckAge   time.Duration
	Position uint64
	Acks     uint64
	// Waiting counts the copies appended to the pchannel and not acked
	// yet (the leader's live tasks), the oldest of a task OldestWaiting
	// old: the leader's view of the node's lag.
	Waiting       int
	OldestWaiting time.Duration
	// Local says the node runs in this process; the fields below are its
	// own status.
	Local   bool
	Running bool
	Next    uint64
	End     string
	Lag     string
	Stage   string
	Applied uint64
	Error   string
}

// waiting is a pchannel's copies appended and not acked yet.
type waiting struct {
	n      int
	oldest time.Time
}

type pchanRow struct {
	Name, Lane string
}

type countRow struct {
	Type                          string
	Pending, Replicated, Tombston int
}

type overviewData struct {
	Role       string
	Promoting  bool
	PChannels  []pchanRow
	Nodes      []nodeRow
	NoNodes    bool
	Repl       replData
	Counts     []countRow
	Live       int
	Tombstones int
	Oldest     *broadcast.TaskInfo
	OldestAge  time.Duration
	Failing    []broadcast.TaskInfo
	Stats      broadcast.Stats
	// Early lists, per retention class, the tombstones max_count evicted
	// before their max_lifetime.
	Early []classCount
	// Charts are the small charts of throughput, latency and live tasks
	// (Config.Counters), none before the second sample.
	Charts []chart
}

// classCount is a retention class's count.
type classCount struct {
	Class string
	N     int
}

func (c *Console) overview(r *request) (view, error) {
	d := overviewData{Charts: c.overviewCharts()}
	for _, p := range c.cfg.PChannels {
		d.PChannels = append(d.PChannels, pchanRow{Name: string(p), Lane: string(c.cfg.Lane(p))})
	}
	if r.b == nil {
		d.Nodes, d.NoNodes = c.nodeRows(r, nil)
		return d, nil
	}
	b := r.b
	d.Role = b.Role().String()
	d.Promoting = b.Promoting()
	d.Stats = b.Stats()
	d.Live, d.Tombstones = d.Stats.Live, d.Stats.Tombstones
	early := b.EarlyEvictions()
	for _, cl := range slices.Sorted(maps.Keys(early)) {
		d.Early = append(d.Early, classCount{Class: cl, N: early[cl]})
	}
	live, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
	if err != nil {
		return nil, err
	}
	d.Nodes, d.NoNodes = c.nodeRows(r, waitingCopies(live))
	counts := map[string]*countRow{}
	row := func(t string) *countRow {
		if counts[t] == nil {
			counts[t] = &countRow{Type: t}
		}
		return counts[t]
	}
	for i, t := range live {
		switch t.State {
		case broadcast.Pending:
			row(t.Type.String()).Pending++
		case broadcast.Replicated:
			row(t.Type.String()).Replicated++
		}
		if d.Oldest == nil || t.CreatedAt.Before(d.Oldest.CreatedAt) {
			d.Oldest = &live[i]
		}
		if t.Callback.LastError != "" || t.LastAppendError != "" {
			d.Failing = append(d.Failing, t)
		}
	}
	if d.Oldest != nil {
		d.OldestAge = r.now.Sub(d.Oldest.CreatedAt)
	}
	if c.cfg.TaskCounts != nil {
		for _, tc := range c.cfg.TaskCounts() {
			if tc.State == "tombstone" {
				row(tc.Type).Tombston += tc.N
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		d.Counts = append(d.Counts, *counts[k])
	}
	if len(d.Failing) > 10 {
		d.Failing = d.Failing[:10]
	}
	d.Repl = c.replState(r)
	return d, nil
}

// waitingCopies counts, per pchannel, the copies of live tasks appended and
// not acked yet.
func waitingCopies(live []broadcast.TaskInfo) map[message.PChannel]waiting {
	out := map[message.PChannel]waiting{}
	for _, t := range live {
		for _, v := range t.VChannels {
			if !v.Appended || v.Acked {
				continue
			}
			p := v.VChannel.PChannel()
			w := out[p]
			w.n++
			if w.oldest.IsZero() || t.CreatedAt.Before(w.oldest) {
				w.oldest = t.CreatedAt
			}
			out[p] = w
		}
	}
	return out
}

// nodeRows lists the streaming nodes by name and pchannel: those the
// leader took acks from (Config.NodeAcks), wherever they run, and those in
// this process (Config.Nodes) with their own status and apply lag
// (node.PChannelStatus.Lag: its own entries not yet handled). Every row
// shows the copies waiting on its pchannel (waits); a pchannel with
// waiting copies and no node gets a row of its own.
func (c *Console) nodeRows(r *request, waits map[message.PChannel]waiting) ([]nodeRow, bool) {
	type key struct{ node, pchan string }
	rows := map[key]*nodeRow{}
	row := func(node, pchan string) *nodeRow {
		k := key{node, pchan}
		if rows[k] == nil {
			rows[k] = &nodeRow{Name: node, PChannel: pchan, End: "-", Lag: "-"}
		}
		return rows[k]
	}
	if c.cfg.NodeAcks != nil && r.b != nil {
		for _, a := range c.cfg.NodeAcks() {
			nr := row(a.Node, string(a.PChannel))
			nr.Acked, nr.AckAge, nr.Position, nr.Acks = true, r.now.Sub(a.At), a.Position, a.Acks
		}
	}
	if c.cfg.Nodes != nil {
		for _, n := range c.cfg.Nodes() {
			for _, p := range n.PChannels {
				nr := row(n.Name, string(p.PChannel))
				nr.Local, nr.Running, nr.Next, nr.End, nr.Lag = true, n.Running, p.NextOffset, "?", "?"
				nr.Stage, nr.Applied, nr.Error = string(p.Stage), p.Applied, cmp.Or(p.LastError, p.ReadError)
				if c.cfg.WALEnd != nil {
					ectx, cancel := context.WithTimeout(r.Context(), time.Second)
					end, err := c.cfg.WALEnd(ectx, p.PChannel)
					cancel()
					if err == nil {
						nr.End = strconv.FormatUint(end, 10)
						nr.Lag = strconv.FormatUint(p.Lag(end), 10)
					}
				}
			}
			if len(n.PChannels) == 0 {
				nr := row(n.Name, "")
				nr.Local, nr.Running = true, n.Running
			}
		}
	}
	served := map[string]bool{}
	for k := range rows {
		served[k.pchan] = true
	}
	for p := range waits {
		if !served[string(p)] {
			row("", string(p))
		}
	}
	out := make([]nodeRow, 0, len(rows))
	for _, k := range slices.SortedFunc(maps.Keys(rows), func(a, b key) int {
		// Pchannels that no node serves come last.
		unserved := func(k key) int {
			if k.node == "" {
				return 1
			}
			return 0
		}
		return cmp.Or(cmp.Compare(unserved(a), unserved(b)), cmp.Compare(a.node, b.node), cmp.Compare(a.pchan, b.pchan))
	}) {
		nr := rows[k]
		if w, ok := waits[message.PChannel(k.pchan)]; ok {
			nr.Waiting, nr.OldestWaiting = w.n, r.now.Sub(w.oldest)
		}
		out = append(out, *nr)
	}
	return out, len(out) == 0
}

// ---- tasks

type taskFilter struct {
	States    []string
	Type      string
	OlderThan string
	Hanging   bool
	Q         string
	After     uint64
	Limit     int
}

type taskRow struct {
	broadcast.TaskInfo
	Age    time.Duration
	Acked  int
	Target int
}

type tasksData struct {
	F        taskFilter
	Rows     []taskRow
	Next     string // URL of the next page, "" if none
	First    string // URL of the first page, "" on it
	Hanging  time.Duration
	AllState []string
}

// parseTaskFilter reads the tasks page's query; every malformed value is a
// 400 naming it.
func (c *Console) parseTaskFilter(q url.Values) (taskFilter, broadcast.Filter, error) {
	var f taskFilter
	var bf broadcast.Filter
	for k := range q {
		switch k {
		case "state", "type", "older_than", "hanging", "q", "after", "limit":
		default:
			return f, bf, badRequest("unknown filter %q", clean(k))
		}
	}
	for _, s := range q["state"] {
		if s == "" {
			continue
		}
		st, err := broadcast.ParseState(s)
		if err != nil {
			return f, bf, badRequest("state %q is not PENDING, REPLICATED or TOMBSTONE", clean(s))
		}
		f.States = append(f.States, st.String())
		bf.States = append(bf.States, st)
	}
	if s := q.Get("type"); s != "" {
		t, err := message.ParseType(s)
		if err != nil {
			return f, bf, badRequest("type %q: %v", clean(s), err)
		}
		f.Type, bf.Type = t.String(), t
	}
	if s := q.Get("older_than"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || d > maxAge {
			return f, bf, badRequest("older_than %q is not a duration between 0s and 10 years (e.g. 90s, 5m)", clean(s))
		}
		f.OlderThan, bf.OlderThan = s, d
	}
	if s := q.Get("hanging"); s != "" {
		if s != "on" && s != "1" && s != "true" {
			return f, bf, badRequest("hanging %q: use hanging=on", clean(s))
		}
		f.Hanging = true
		// Hanging: live tasks older than the threshold (or older_than).
		if bf.OlderThan == 0 {
			bf.OlderThan = c.cfg.Hanging
		}
		if len(bf.States) == 0 {
			bf.States = []broadcast.State{broadcast.Pending, broadcast.Replicated}
		}
	}
	f.Q = q.Get("q")
	if len(f.Q) > 256 {
		return f, bf, badRequest("search text is %d bytes, limit 256", len(f.Q))
	}
	if s := q.Get("after"); s != "" {
		id, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return f, bf, badRequest("after %q is not a task id", clean(s))
		}
		f.After = id
	}
	f.Limit = DefaultPageSize
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxPageSize {
			return f, bf, badRequest("limit %q is not between 1 and %d", clean(s), MaxPageSize)
		}
		f.Limit = n
	}
	return f, bf, nil
}

// matches is the text search: an id (exactly, or as a prefix of its
// decimal form), or a substring of the type or the key fingerprint.
func matches(t broadcast.TaskInfo, q string) bool {
	if q == "" {
		return true
	}
	id := strconv.FormatUint(t.ID, 10)
	q = strings.TrimPrefix(strings.TrimSpace(q), "#")
	return strings.HasPrefix(id, q) || strings.Contains(strings.ToLower(t.Type.String()), strings.ToLower(q)) ||
		(t.KeyFingerprint != "" && strings.HasPrefix(t.KeyFingerprint, strings.ToLower(q)))
}

func (c *Console) tasks(r *request) (view, error) {
	f, bf, err := c.parseTaskFilter(r.URL.Query())
	if err != nil {
		return nil, err
	}
	// The engine pages by count only: filter by cursor and text here
	// (see the package's report for the engine API wanted).
	all, err := r.b.Tasks(bf)
	if err != nil {
		return nil, err
	}
	d := tasksData{F: f, Hanging: c.cfg.Hanging, AllState: []string{"PENDING", "REPLICATED", "TOMBSTONE"}}
	more := false
	for _, t := range all {
		if t.ID <= f.After || !matches(t, f.Q) {
			continue
		}
		if len(d.Rows) == f.Limit {
			more = true
			break
		}
		row := taskRow{TaskInfo: t, Age: r.now.Sub(t.CreatedAt), Target: len(t.VChannels)}
		for _, v := range t.VChannels {
			if v.Acked {
				row.Acked++
			}
		}
		d.Rows = append(d.Rows, row)
	}
	if more {
		q := r.URL.Query()
		q.Set("after", strconv.FormatUint(d.Rows[len(d.Rows)-1].ID, 10))
		d.Next = Prefix + "tasks?" + q.Encode()
	}
	if f.After > 0 {
		q := r.URL.Query()
		q.Del("after")
		d.First = Prefix + "tasks?" + q.Encode()
	}
	return d, nil
}

// ---- one task

type taskData struct {
	T          broadcast.TaskInfo
	Size       int
	Payload    int
	TraceID    string
	TraceURL   string
	Expires    time.Time
	Retention  time.Duration
	Age        time.Duration
	Acked      int
	CanRetry   bool
	CanForce   bool
	Done       string
	Properties [][2]string
	// Copies are the targets with their copies' role, phase and extra
	// (R13.10-R13.12); HasCopies says whether any copy has one.
	Copies    []copyRow
	HasCopies bool
	// Group is the task's place in its group (R13.1, R13.7), "" if none.
	Group string
	// App is the application's outcome when it differs from the
	// broadcast's (Config.ApplicationOutcome): HasApp says whether there
	// is one, AppFailed whether it is a failure.
	App       broadcast.Outcome
	HasApp    bool
	AppFailed bool
	// Timeline draws the task's recorded times ("" if none were kept).
	Timeline template.HTML
	// Kept is how many finished tasks keep their timeline.
	Kept int
}

// copyRow is one target of a task, with its copy's role, its phase in a
// two-phase append and its consumer's extra result.
type copyRow struct {
	broadcast.VChannelInfo
	Role  string
	Phase int
	Extra string
}

// extraText shows a consumer's extra result: text as is, anything else
// in hex, cut at 60 characters.
func extraText(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	s := string(b)
	if !utf8.Valid(b) || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		s = "0x" + hex.EncodeToString(b)
	}
	if r := []rune(s); len(r) > 60 {
		s = string(r[:57]) + "..."
	}
	return s
}

// groupText describes a task's place in its group.
func groupText(t broadcast.TaskInfo) string {
	if t.Message == nil || t.Message.Group == nil {
		return ""
	}
	g := t.Message.Group
	id := g.ID
	if id == 0 {
		id = t.ID
	}
	word := "transaction"
	if g.OwnerKey != "" {
		word = "owner " + g.OwnerKey
	}
	s := fmt.Sprintf("%s %d, member %d (%s)", word, id, g.Seq, g.Kind)
	switch {
	case t.HoldsKeys:
		s += "; holds the group's keys"
	case t.ReleasedBy != 0:
		s += fmt.Sprintf("; its keys were released by broadcast %d", t.ReleasedBy)
	}
	return s
}

func parseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil || id == 0 {
		return 0, badRequest("task id %q is not a positive integer", clean(s))
	}
	return id, nil
}

func (c *Console) task(r *request) (view, error) {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	t, err := r.b.Task(id)
	if err != nil {
		return nil, err
	}
	d := taskData{T: t, Retention: c.cfg.Tombstone.MaxLifetime, Age: r.now.Sub(t.CreatedAt), Kept: broadcast.MaxTimelines}
	if t.HasTimeline {
		d.Timeline = timelineSVG(t, r.now)
	}
	if c.cfg.ApplicationOutcome != nil && t.Outcome.Status != 0 {
		if o, ok := c.cfg.ApplicationOutcome(r.Context(), r.b, t); ok {
			d.App, d.HasApp, d.AppFailed = o, true, o.Status == broadcast.Failed
		}
	}
	switch r.URL.Query().Get("done") {
	case "retry":
		d.Done = "The callback's next attempt was started now."
	case "complete":
		d.Done = "The task was completed by an operator."
	}
	for _, v := range t.VChannels {
		if v.Acked {
			d.Acked++
		}
		row := copyRow{VChannelInfo: v, Phase: 2, Extra: extraText(t.Extras[v.VChannel])}
		if m := t.Message; m != nil {
			row.Role = m.RoleFor(v.VChannel)
			if m.AppendsFirst(v.VChannel) {
				row.Phase = 1
			}
		}
		d.HasCopies = d.HasCopies || row.Role != "" || row.Phase == 1 || row.Extra != ""
		d.Copies = append(d.Copies, row)
	}
	d.Group = groupText(t)
	if m := t.Message; m != nil {
		if raw, err := message.Marshal(m); err == nil {
			d.Size = len(raw)
		}
		d.Payload = len(m.Payload)
		if sc := tracing.SpanContext(m); sc.IsValid() {
			d.TraceID = sc.TraceID().String()
			if c.cfg.TraceURL != "" {
				d.TraceURL = strings.ReplaceAll(c.cfg.TraceURL, "{trace_id}", d.TraceID)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(m.Properties)) {
			d.Properties = append(d.Properties, [2]string{k, m.Properties[k]})
		}
	}
	if !t.CompletedAt.IsZero() && t.CompletedAt.UnixNano() != 0 && c.cfg.Tombstone.MaxLifetime > 0 {
		d.Expires = t.CompletedAt.Add(c.cfg.Tombstone.MaxLifetime)
	}
	live := t.State != broadcast.Tombstone
	d.CanRetry = live && t.Callback.Running
	d.CanForce = live && t.Callback.Running
	return d, nil
}

func (c *Console) retry(r *request) (string, error) {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return "", err
	}
	if err := r.b.RetryCallback(id); err != nil {
		return "", err
	}
	return fmt.Sprintf("%stasks/%d?done=retry", Prefix, id), nil
}

// maxReason matches the API's bound on a completion reason.
const maxReason = 1 << 10

func (c *Console) complete(r *request) (string, error) {
	id, err := parseID(r.PathValue("id"))
	if err != nil {
		return "", err
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	switch {
	case r.PostFormValue("confirm") != "yes":
		return "", badRequest("tick the confirmation: completing skips the callback's effects")
	case reason == "":
		return "", badRequest("a reason is required: it becomes the task's recorded outcome")
	case len(reason) > maxReason:
		return "", badRequest("the reason is %d bytes, limit %d", len(reason), maxReason)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := r.b.CompleteCallback(ctx, id, "completed by "+r.who.Name+" in the console: "+reason); err != nil {
		return "", err
	}
	return fmt.Sprintf("%stasks/%d?done=complete", Prefix, id), nil
}

// ---- locks

type lockRow struct {
	Key     string
	Domain  string
	Name    string
	Holders []holderRow
	Waiters []holderRow
}

type holderRow struct {
	resource.Holder
	ID  uint64 // the task, when the owner names one
	Age time.Duration
}

func (c *Console) locks(r *request) (view, error) {
	var rows []lockRow
	holders := func(hs []resource.Holder) []holderRow {
		out := make([]holderRow, len(hs))
		for i, h := range hs {
			out[i] = holderRow{Holder: h, Age: r.now.Sub(h.Since)}
			if id, err := strconv.ParseUint(strings.TrimPrefix(h.Owner, "broadcast "), 10, 64); err == nil {
				out[i].ID = id
			}
		}
		return out
	}
	for _, ks := range r.b.Locks() {
		rows = append(rows, lockRow{Domain: ks.Domain.String(), Name: ks.Name, Holders: holders(ks.Holders), Waiters: holders(ks.Waiters)})
	}
	return rows, nil
}

// ---- keys

type keysData struct {
	Type, Scope, ClientKey string
	Asked                  bool
	Fingerprint            string
	Status                 *broadcast.KeyStatus
	NotFound               bool
	// Keys is one page of the remembered keys (R7.5); First, Prev and Next
	// are the URLs of the first, the previous and the next page, "" if
	// none.
	Keys              []keyRow
	First, Prev, Next string
}

// keyRow is one remembered key in the keys page's list.
type keyRow struct {
	*broadcast.KeyStatus
	Scope, Fingerprint string
}

func (c *Console) keys(r *request) (view, error) {
	q := r.URL.Query()
	d := keysData{Type: q.Get("type"), Scope: cmp.Or(q.Get("scope"), "cluster"), ClientKey: q.Get("client_key")}
	if d.Type == "" && d.ClientKey == "" {
		return d, c.keyList(r, &d)
	}
	d.Asked = true
	typ, err := message.ParseType(d.Type)
	if err != nil {
		return nil, badRequest("type %q: %v", clean(d.Type), err)
	}
	if d.ClientKey == "" {
		return nil, badRequest("client key is required")
	}
	if len(d.ClientKey) > 4096 {
		return nil, badRequest("client key is %d bytes, limit 4096", len(d.ClientKey))
	}
	var k message.IdempotencyKey
	switch dom, id, _ := strings.Cut(d.Scope, ":"); dom {
	case "cluster":
		k = message.ClusterKey(d.ClientKey)
	case "db", "collection":
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			return nil, badRequest("scope %q: the id is not a number", clean(d.Scope))
		}
		if dom == "db" {
			k = message.DatabaseKey(n, d.ClientKey)
		} else {
			k = message.CollectionKey(n, d.ClientKey)
		}
	default:
		return nil, badRequest("scope %q is not cluster, db:<id> or collection:<id>", clean(d.Scope))
	}
	if err := k.Validate(); err != nil {
		return nil, badRequest("key: %v", err)
	}
	d.Fingerprint = k.Fingerprint()
	ks, err := r.b.Lookup(r.Context(), typ, k)
	switch {
	case err == nil:
		d.Status = ks
	case codeOf(err) == 404:
		d.NotFound = true
	default:
		return nil, err
	}
	return d, nil
}

// keyList reads the page of remembered keys after the id of the keys
// page's "after" parameter (0: the first), DefaultPageSize of them. The
// list only goes forward, so the URL carries the cursors of the pages
// before it ("back", oldest first, at most maxBack) for the link to the
// previous page.
func (c *Console) keyList(r *request, d *keysData) error {
	q := r.URL.Query()
	cursor := func(s string) (uint64, error) {
		if s == "" {
			return 0, nil
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, badRequest("page cursor %q is not a broadcast id", clean(s))
		}
		return n, nil
	}
	after, err := cursor(q.Get("after"))
	if err != nil {
		return err
	}
	back := q["back"]
	if len(back) > maxBack {
		return badRequest("%d earlier pages, limit %d", len(back), maxBack)
	}
	for _, b := range back {
		if _, err := cursor(b); err != nil {
			return err
		}
	}
	keys, next, err := r.b.Keys(r.Context(), after, DefaultPageSize)
	if err != nil {
		return err
	}
	for _, ks := range keys {
		k := ks.Message.IdempotencyKey
		d.Keys = append(d.Keys, keyRow{KeyStatus: ks, Scope: k.ScopeName(), Fingerprint: k.Fingerprint()})
	}
	link := func(after string, back []string) string {
		if after == "" || after == "0" {
			return Prefix + "keys"
		}
		v := url.Values{"after": {after}}
		if len(back) > 0 {
			v["back"] = back
		}
		return Prefix + "keys?" + v.Encode()
	}
	here := strconv.FormatUint(after, 10)
	if next != 0 {
		b := append(slices.Clone(back), here)
		d.Next = link(strconv.FormatUint(next, 10), b[max(0, len(b)-maxBack):])
	}
	if after != 0 {
		d.First = link("", nil)
		if len(back) > 0 {
			d.Prev = link(back[len(back)-1], back[:len(back)-1])
		} else {
			d.Prev = d.First
		}
	}
	return nil
}

// ---- imports

type importsData struct {
	Available bool
	Jobs      []*walcastv1.ImportJob
	Err       string
	// First and Next are the URLs of the first and the next page, "" if
	// none.
	First, Next string
}

// imports shows one page of the import jobs: the first, or the one after
// the token of its "page" parameter.
func (c *Console) imports(r *request) (view, error) {
	if c.cfg.Imports == nil {
		return importsData{}, nil
	}
	token := r.URL.Query().Get("page")
	if len(token) > maxPageToken {
		return nil, badRequest("page token of %d bytes", len(token))
	}
	jobs, next, err := c.cfg.Imports(r.Context(), token)
	d := importsData{Available: true, Jobs: jobs}
	if err != nil {
		d.Err = err.Error()
	}
	if next != "" {
		d.Next = Prefix + "imports?" + url.Values{"page": {next}}.Encode()
	}
	if token != "" {
		d.First = Prefix + "imports"
	}
	return d, nil
}

// maxPageToken bounds a page token in a URL.
const maxPageToken = 1024

// ---- collections

type collectionsData struct {
	Available bool
	Database  string
	Colls     []*walcastv1.Collection
	Err       string
	// First, Prev and Next are the URLs of the first, the previous and the
	// next page, "" if none.
	First, Prev, Next string
}

// maxBack is how many earlier pages' tokens a collections page's URL
// keeps for its "previous" links; further back, "first page" goes on.
const maxBack = 8

// collections shows one page of the collections of the database of its
// "db" parameter: the first, or the one after the token of its "page"
// parameter. The list only goes forward, so the URL carries the tokens of
// the pages before it ("back", oldest first, at most maxBack) for the link
// to the previous page.
func (c *Console) collections(r *request) (view, error) {
	if c.cfg.Collections == nil {
		return collectionsData{}, nil
	}
	q := r.URL.Query()
	d := collectionsData{Available: true, Database: q.Get("db")}
	if d.Database == "" {
		return d, nil
	}
	if len(d.Database) > 128 {
		return nil, badRequest("database name of %d bytes", len(d.Database))
	}
	token, back := q.Get("page"), q["back"]
	if len(back) > maxBack {
		return nil, badRequest("%d earlier pages, limit %d", len(back), maxBack)
	}
	for _, t := range append([]string{token}, back...) {
		if len(t) > maxPageToken {
			return nil, badRequest("page token of %d bytes", len(t))
		}
	}
	colls, next, err := c.cfg.Collections(r.Context(), d.Database, token)
	d.Colls = colls
	if err != nil {
		d.Err = err.Error()
	}
	link := func(page string, back []string) string {
		v := url.Values{"db": {d.Database}}
		if page != "" {
			v.Set("page", page)
			if len(back) > 0 {
				v["back"] = back
			}
		}
		return Prefix + "collections?" + v.Encode()
	}
	if next != "" {
		b := append(slices.Clone(back), token)
		d.Next = link(next, b[max(0, len(b)-maxBack):])
	}
	if token != "" {
		d.First = link("", nil)
		if len(back) > 0 {
			d.Prev = link(back[len(back)-1], back[:len(back)-1])
		} else {
			d.Prev = d.First
		}
	}
	return d, nil
}

// ---- replication

type replData struct {
	Cluster     string
	Role        string
	Config      broadcast.ReplicateConfig
	Promoting   bool
	Available   bool
	Running     bool
	Chans       []replicate.PChannelStatus
	Incomplete  []taskRow
	LastErrors  int
	TotalLag    uint64
	HasReplConf bool
}

func (c *Console) replState(r *request) replData {
	b := r.b
	d := replData{Cluster: b.ClusterName(), Role: b.Role().String(), Config: b.ReplicateConfig(), Promoting: b.Promoting()}
	d.HasReplConf = d.Config.Primary != ""
	if c.cfg.Replication != nil {
		d.Available = true
		d.Running, d.Chans = c.cfg.Replication()
		for _, ch := range d.Chans {
			d.TotalLag += ch.Lag
			if ch.LastError != "" {
				d.LastErrors++
			}
		}
	}
	return d
}

func (c *Console) replication(r *request) (view, error) {
	d := c.replState(r)
	live, err := r.b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}, Limit: MaxPageSize})
	if err != nil {
		return nil, err
	}
	for _, t := range live {
		row := taskRow{TaskInfo: t, Age: r.now.Sub(t.CreatedAt), Target: len(t.VChannels)}
		for _, v := range t.VChannels {
			if v.Acked {
				row.Acked++
			}
		}
		d.Incomplete = append(d.Incomplete, row)
	}
	return d, nil
}
