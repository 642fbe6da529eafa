package node

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/walcast/walcast/internal/arenamap"
	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/message"
)

// vstate is what the node records about one vchannel.
type vstate struct {
	ids     idset.Set // the broadcasts applied, as ranges (dense ids stay a handful)
	applied uint64    // broadcasts applied
	last    uint64    // last broadcast id applied
}

// appendTo appends vs's encoding: uvarint(applied), uvarint(last),
// uvarint(len(ids)), ids (idset's encoding). A vchannel's record in the
// state files is its name, this, and the Applier's snapshot.
func (vs *vstate) appendTo(b []byte) []byte {
	b = binary.AppendUvarint(b, vs.applied)
	b = binary.AppendUvarint(b, vs.last)
	return appendBytes(b, vs.ids.Encode())
}

// decodeVState reads what appendTo wrote.
func decodeVState(b []byte) (*vstate, error) {
	applied, last, enc, err := splitVState(b)
	if err != nil {
		return nil, err
	}
	ids, err := idset.Decode(enc)
	if err != nil {
		return nil, errMalformedIDs
	}
	return &vstate{ids: ids, applied: applied, last: last}, nil
}

// checkVState reports whether b decodes (decodeVState), without decoding
// its ids.
func checkVState(b []byte) error {
	_, _, enc, err := splitVState(b)
	if err == nil && idset.Check(enc) != nil {
		err = errMalformedIDs
	}
	return err
}

var errMalformedIDs = errors.New("malformed id ranges")

// splitVState splits an encoding of appendTo into its fields, the ids
// still encoded.
func splitVState(b []byte) (applied, last uint64, ids []byte, err error) {
	r := fieldReader{b: b}
	applied, last = r.uvarint(), r.uvarint()
	ids = r.bytes()
	if r.err || len(r.b) > 0 {
		return 0, 0, nil, errors.New("truncated vchannel state")
	}
	return applied, last, ids, nil
}

// pstate is the durable state of one pchannel, minus the Applier's.
//
// A vchannel's state is kept decoded (hot) from the copy applied to it
// until the next save, then encoded (cold) in an arenamap.Map: at a
// million vchannels their states cost their encodings and their names'
// bytes, held where the garbage collector does not scan, not a struct, a
// slice and a map entry each.
type pstate struct {
	// resume is the offset of the first entry not completely handled
	// (applied and acked).
	resume uint64
	// handled is the position of the last copy handled; copies at or below
	// it were applied (or were duplicates) in this state's lineage.
	handled uint64
	// last is the last broadcast id applied on the pchannel.
	last uint64
	// logID is the identity of the log resume and handled are positions
	// in (wal.Identified; "" before it was first read): a log of another
	// identity is another log, whatever its length (R9.14).
	logID string
	// hot are the vchannels applied to since the last save: a save writes
	// these. cold holds the others' encodings, by vchannel (never both).
	hot  map[message.VChannel]*vstate
	cold arenamap.Map
}

func newPState() *pstate {
	return &pstate{hot: make(map[message.VChannel]*vstate)}
}

// vchannels is how many vchannels the state knows.
func (st *pstate) vchannels() int { return len(st.hot) + st.cold.Len() }

// each yields every vchannel the state knows, hot and cold.
func (st *pstate) each(yield func(message.VChannel) bool) {
	for v := range st.hot {
		if !yield(v) {
			return
		}
	}
	for v := range st.cold.All() {
		if !yield(message.VChannel(v)) {
			return
		}
	}
}

// get returns v's state (nil: none). A cold state is decoded for the
// caller: changing it changes nothing.
func (st *pstate) get(v message.VChannel) *vstate {
	if vs := st.hot[v]; vs != nil {
		return vs
	}
	enc, ok := st.cold.Get(string(v))
	if !ok {
		return nil
	}
	vs, err := decodeVState(enc)
	if err != nil {
		// The map holds only what appendTo wrote.
		panic(fmt.Sprintf("node: the state of %s does not decode: %v", v, err))
	}
	return vs
}

// touch returns v's state to change, hot until the next save (created if
// v has none).
func (st *pstate) touch(v message.VChannel) *vstate {
	if vs := st.hot[v]; vs != nil {
		return vs
	}
	vs := st.get(v)
	if vs == nil {
		vs = &vstate{}
	}
	st.cold.Delete(string(v))
	st.hot[v] = vs
	return vs
}

// putCold stores an encoded state for v (a loaded one).
func (st *pstate) putCold(v message.VChannel, enc []byte) {
	delete(st.hot, v)
	st.cold.Put(string(v), enc)
}

// settle makes every hot state cold, after a save wrote them.
func (st *pstate) settle() {
	var b []byte
	for v, vs := range st.hot {
		b = vs.appendTo(b[:0])
		st.putCold(v, b)
	}
}

// encoded appends v's encoded state to b: the cold bytes as they are.
func (st *pstate) encoded(b []byte, v message.VChannel) []byte {
	if vs := st.hot[v]; vs != nil {
		return vs.appendTo(b)
	}
	enc, _ := st.cold.Get(string(v))
	return append(b, enc...)
}

func (st *pstate) applied(v message.VChannel, id uint64) bool {
	if vs := st.hot[v]; vs != nil {
		return vs.ids.Has(id)
	}
	vs := st.get(v)
	return vs != nil && vs.ids.Has(id)
}

// The state of a pchannel is two files in StateDir (format version 2):
//
//   - the base, "<pchannel>.state": the whole state at some point, written
//     to a temporary file, fsynced and renamed over the old one;
//   - the journal, "<pchannel>.journal": the saves since, each one batch
//     appended and fsynced, holding what changed: the log position, and
//     the state of each vchannel applied to since the save before (its
//     applied ids and, for a VChannelApplier, its snapshot).
//
// A save thus writes what changed, not every vchannel the pchannel ever
// had. Once the journal outgrows the base (and compactMin), a save writes
// a new base instead and starts an empty journal. Both files begin with a
// header naming the pchannel and the base's generation; a journal applies
// to the base of its generation only, so a crash between writing a new
// base and starting its journal leaves an old journal that is ignored. A
// batch cut short by a crash fails its checksum and ends the journal: the
// save it was did not happen. Loading reads the base and replays the
// journal; a corrupt base, or a corrupt batch followed by more, is
// ErrCorruptState.
//
// Every part is a frame: uvarint(len(body)), body, crc32c(body) (4 bytes,
// big endian). Bodies start with a kind byte:
//
//	'F' file header: version string, kind ('S' base, 'J' journal),
//	    uvarint(generation), pchannel, node
//	'H' head:        uvarint(resume), uvarint(handled), uvarint(last)
//	'V' vchannel:    vchannel, uvarint(applied), uvarint(last), ids
//	                 (idset encoding), applier snapshot (absent: none)
//	'A' applier:     the whole pchannel's snapshot (a plain Applier)
//	'B' batch:       a journal's save: a head, uvarint(n), n vchannels,
//	                 then an optional whole snapshot
//	'E' end:         uvarint(vchannels): the base is complete
//
// Strings and byte strings are uvarint(len) then the bytes; an optional
// one is uvarint(len+1) (0: absent).
const (
	stateFormat  = "walcast-node-state/2"
	baseSuffix   = ".state"
	journalExt   = ".journal"
	frameMaxBody = 1 << 30
)

// compactMin is the least journal a save compacts into a new base (tests
// lower it).
var compactMin int64 = 1 << 20

// stateMagicV1 starts a state file of version 1 (one JSON document per
// pchannel, rewritten at every save), which New still reads: the first
// save writes version 2.
const stateMagicV1 = "walcast-node-state/1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// saved is a pchannel's state as loaded from StateDir: the node's part, and
// the Applier's: per vchannel (a VChannelApplier's snapshots) and whole (a
// plain Applier's).
type saved struct {
	st *pstate
	// apps holds the snapshots by vchannel name: at a million vchannels,
	// where the garbage collector does not scan them.
	apps  arenamap.Map
	whole []byte
	// gen is the base's generation; baseSize and journalSize the files'
	// sizes (journalSize: the part that holds whole saves; a save cut
	// short after it is torn). legacy marks a version 1 file: the next
	// save rewrites it.
	gen                   uint64
	baseSize, journalSize int64
	torn                  bool
	legacy                bool
}

// appendFrame appends a frame of body to b.
func appendFrame(b, body []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(body)))
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
}

func appendBytes(b, s []byte) []byte { return append(binary.AppendUvarint(b, uint64(len(s))), s...) }
func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendOptional appends s, or absent (nil).
func appendOptional(b, s []byte) []byte {
	if s == nil {
		return binary.AppendUvarint(b, 0)
	}
	return append(binary.AppendUvarint(b, uint64(len(s))+1), s...)
}

func appendHead(b []byte, st *pstate) []byte {
	b = binary.AppendUvarint(b, st.resume)
	b = binary.AppendUvarint(b, st.handled)
	b = binary.AppendUvarint(b, st.last)
	return appendString(b, st.logID)
}

// appendVChannel appends v's record (without kind byte): its name, its
// state as st holds it, and app.
func appendVChannel(b []byte, st *pstate, v message.VChannel, app []byte) []byte {
	b = appendString(b, string(v))
	b = st.encoded(b, v)
	return appendOptional(b, app)
}

func fileHeader(kind byte, gen uint64, node string, p message.PChannel) []byte {
	b := append([]byte{'F'}, stateFormat...)
	b = append(b, 0, kind)
	b = binary.AppendUvarint(b, gen)
	b = appendString(b, string(p))
	return appendString(b, node)
}

// reader decodes the fields of one frame's body.
type fieldReader struct {
	b   []byte
	err bool
}

func (r *fieldReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err, r.b = true, nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *fieldReader) bytes() []byte {
	n := r.uvarint()
	if r.err || n > uint64(len(r.b)) {
		r.err, r.b = true, nil
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func (r *fieldReader) optional() []byte {
	n := r.uvarint()
	if r.err || n == 0 {
		return nil
	}
	if n-1 > uint64(len(r.b)) {
		r.err, r.b = true, nil
		return nil
	}
	s := r.b[: n-1 : n-1]
	r.b = r.b[n-1:]
	return s
}

func (r *fieldReader) head(st *pstate) {
	st.resume, st.handled, st.last = r.uvarint(), r.uvarint(), r.uvarint()
	st.logID = string(r.bytes())
}

// vchannel reads a vchannel's record of pchannel p into into and apps.
func (r *fieldReader) vchannel(p message.PChannel, into *pstate, apps *arenamap.Map) error {
	v := message.VChannel(r.bytes())
	start := r.b
	r.uvarint()
	r.uvarint()
	r.bytes()
	enc := start[:len(start)-len(r.b)]
	app := r.optional()
	if r.err {
		return errors.New("truncated vchannel record")
	}
	if err := v.Validate(); err != nil || v.PChannel() != p {
		return fmt.Errorf("vchannel %q is not hosted on the pchannel", v)
	}
	if err := checkVState(enc); err != nil {
		return fmt.Errorf("vchannel %s: %v", v, err)
	}
	into.putCold(v, enc)
	if app != nil {
		apps.Put(string(v), app)
	} else {
		apps.Delete(string(v))
	}
	return nil
}

// nextFrame reads one frame from data: its body and the rest. ok is false
// at the end of data, or at a frame that is cut short or fails its
// checksum; atEnd then says whether that frame reaches the end of data (a
// write cut short there) rather than damage followed by more frames.
func nextFrame(data []byte) (body, rest []byte, ok, atEnd bool) {
	if len(data) == 0 {
		return nil, nil, false, true
	}
	n, k := binary.Uvarint(data)
	if k <= 0 || n > frameMaxBody || uint64(len(data)-k) < n+4 {
		return nil, nil, false, true
	}
	body = data[k : k+int(n)]
	sum := binary.BigEndian.Uint32(data[k+int(n):])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, nil, false, k+int(n)+4 == len(data)
	}
	return body, data[k+int(n)+4:], true, false
}

// readHeader checks a file's header frame: version, kind and pchannel.
func readHeader(data []byte, kind byte, p message.PChannel) (gen uint64, rest []byte, err error) {
	body, rest, ok, _ := nextFrame(data)
	if !ok || len(body) < 1 || body[0] != 'F' {
		return 0, nil, errors.New("no header")
	}
	r := fieldReader{b: body[1:]}
	i := bytes.IndexByte(r.b, 0)
	if i < 0 || string(r.b[:i]) != stateFormat || len(r.b) < i+2 {
		return 0, nil, errors.New("unsupported format")
	}
	if r.b[i+1] != kind {
		return 0, nil, fmt.Errorf("file of kind %q, want %q", r.b[i+1], kind)
	}
	r.b = r.b[i+2:]
	gen = r.uvarint()
	fp := message.PChannel(r.bytes())
	r.bytes() // the node's name
	if r.err {
		return 0, nil, errors.New("truncated header")
	}
	if fp != p {
		return 0, nil, fmt.Errorf("file holds the state of pchannel %q", fp)
	}
	return gen, rest, nil
}

func basePath(dir string, p message.PChannel) string { return filepath.Join(dir, string(p)+baseSuffix) }
func journalPath(dir string, p message.PChannel) string {
	return filepath.Join(dir, string(p)+journalExt)
}

// statePath is the base file of p (the one file of format version 1).
func statePath(dir string, p message.PChannel) string { return basePath(dir, p) }

func tempPattern(p message.PChannel) string { return "." + string(p) + ".state.tmp-*" }

// loadState reads p's state from dir; ok is false if there is none.
func loadState(dir string, p message.PChannel) (s *saved, ok bool, err error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: pchannel %s: %s", ErrCorruptState, p, fmt.Sprintf(format, args...))
	}
	data, err := os.ReadFile(basePath(dir, p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("node: read state of %s: %w", p, err)
	}
	if bytes.HasPrefix(data, []byte(stateMagicV1+" ")) {
		st, whole, err := decodeStateV1(p, data)
		if err != nil {
			return nil, false, err
		}
		return &saved{st: st, whole: whole, legacy: true, baseSize: int64(len(data))}, true, nil
	}
	s = &saved{st: newPState(), baseSize: int64(len(data))}
	gen, rest, err := readHeader(data, 'S', p)
	if err != nil {
		return nil, false, corrupt("base: %v", err)
	}
	s.gen = gen
	complete := false
	for !complete {
		body, next, ok, _ := nextFrame(rest)
		if !ok || len(body) == 0 {
			return nil, false, corrupt("base ends without its end record")
		}
		rest = next
		r := fieldReader{b: body[1:]}
		switch body[0] {
		case 'H':
			r.head(s.st)
		case 'V':
			if err := r.vchannel(p, s.st, &s.apps); err != nil {
				return nil, false, corrupt("base: %v", err)
			}
		case 'A':
			s.whole = r.bytes()
		case 'E':
			if n := r.uvarint(); !r.err && n != uint64(s.st.vchannels()) {
				return nil, false, corrupt("base ends after %d of %d vchannels", s.st.vchannels(), n)
			}
			complete = true
		default:
			return nil, false, corrupt("base: unknown record %q", body[0])
		}
		if r.err {
			return nil, false, corrupt("base: truncated record %q", body[0])
		}
	}
	if len(rest) > 0 {
		return nil, false, corrupt("base: data after its end record")
	}
	if err := s.replay(dir, p); err != nil {
		return nil, false, err
	}
	return s, true, nil
}

// replay applies p's journal to s, if it extends s's base; a batch cut
// short at the end (a save a crash interrupted) is not applied (s.torn;
// the node cuts it off the file before it appends: cutTorn).
func (s *saved) replay(dir string, p message.PChannel) error {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: pchannel %s: journal: %s", ErrCorruptState, p, fmt.Sprintf(format, args...))
	}
	path := journalPath(dir, p)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node: read the journal of %s: %w", p, err)
	}
	gen, rest, err := readHeader(data, 'J', p)
	if err != nil || gen != s.gen {
		// A journal of an older base (a crash between a new base and its
		// journal), or one whose header a crash cut: the base holds it.
		return nil
	}
	good := len(data) - len(rest)
	for len(rest) > 0 {
		body, next, ok, atEnd := nextFrame(rest)
		if !ok {
			if atEnd {
				break // the last save, cut short
			}
			return corrupt("a damaged batch before the last")
		}
		if len(body) == 0 || body[0] != 'B' {
			return corrupt("unknown record")
		}
		r := fieldReader{b: body[1:]}
		r.head(s.st)
		n := r.uvarint()
		for range n {
			if r.err {
				break
			}
			if err := r.vchannel(p, s.st, &s.apps); err != nil {
				return corrupt("%v", err)
			}
		}
		if whole := r.optional(); whole != nil {
			s.whole = whole
		}
		if r.err {
			return corrupt("truncated batch")
		}
		rest = next
		good = len(data) - len(rest)
	}
	s.journalSize, s.torn = int64(good), good < len(data)
	return nil
}

// cutTorn cuts a save cut short off the end of p's journal.
func (s *saved) cutTorn(dir string, p message.PChannel) error {
	if !s.torn {
		return nil
	}
	if err := os.Truncate(journalPath(dir, p), s.journalSize); err != nil {
		return fmt.Errorf("node: cut the torn save off the journal of %s: %w", p, err)
	}
	s.torn = false
	return nil
}

// journal is an open journal of one pchannel, appended by its saves.
type journal struct {
	f    *os.File
	size int64
}

// encodeBase encodes a whole state as a base of generation gen. apps
// returns a vchannel's applier snapshot (nil: none).
func encodeBase(node string, p message.PChannel, gen uint64, st *pstate, apps func(message.VChannel) ([]byte, error), whole []byte) ([]byte, error) {
	out := appendFrame(nil, fileHeader('S', gen, node, p))
	out = appendFrame(out, appendHead([]byte{'H'}, st))
	var body []byte
	for v := range st.each {
		app, err := apps(v)
		if err != nil {
			return nil, err
		}
		body = appendVChannel(append(body[:0], 'V'), st, v, app)
		out = appendFrame(out, body)
	}
	if whole != nil {
		out = appendFrame(out, appendBytes([]byte{'A'}, whole))
	}
	return appendFrame(out, binary.AppendUvarint([]byte{'E'}, uint64(st.vchannels()))), nil
}

// encodeBatch encodes one save for the journal: the head, the changed
// vchannels, and whole (nil: none).
func encodeBatch(st *pstate, apps func(message.VChannel) ([]byte, error), whole []byte) ([]byte, error) {
	body := appendHead([]byte{'B'}, st)
	body = binary.AppendUvarint(body, uint64(len(st.hot)))
	for v := range st.hot {
		app, err := apps(v)
		if err != nil {
			return nil, err
		}
		body = appendVChannel(body, st, v, app)
	}
	body = appendOptional(body, whole)
	return appendFrame(nil, body), nil
}

// writeBase replaces p's base with data (generation gen) and starts an
// empty journal for it, which it returns open for appending.
func writeBase(dir, node string, p message.PChannel, gen uint64, data []byte) (*journal, error) {
	if err := writeAtomic(dir, basePath(dir, p), p, data); err != nil {
		return nil, err
	}
	head := appendFrame(nil, fileHeader('J', gen, node, p))
	if err := writeAtomic(dir, journalPath(dir, p), p, head); err != nil {
		return nil, err
	}
	return openJournal(dir, p, int64(len(head)))
}

func openJournal(dir string, p message.PChannel, size int64) (*journal, error) {
	f, err := os.OpenFile(journalPath(dir, p), os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &journal{f: f, size: size}, nil
}

// append writes one batch and syncs it.
func (j *journal) append(batch []byte) error {
	if _, err := j.f.Write(batch); err != nil {
		return err
	}
	if err := j.f.Sync(); err != nil {
		return err
	}
	j.size += int64(len(batch))
	return nil
}

func (j *journal) close() error {
	if j == nil {
		return nil
	}
	return j.f.Close()
}

// removeTemps deletes temporary files a crashed save of p left behind.
func removeTemps(dir string, p message.PChannel) {
	names, _ := filepath.Glob(filepath.Join(dir, tempPattern(p)))
	for _, n := range names {
		_ = os.Remove(n)
	}
}

// writeAtomic replaces path (a file of pchannel p in dir) with data: write
// a temporary file, fsync it, rename it over the old file, fsync the
// directory.
func writeAtomic(dir, path string, p message.PChannel, data []byte) (err error) {
	f, err := os.CreateTemp(dir, tempPattern(p))
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err = w.Write(data); err == nil {
		err = w.Flush()
	}
	if err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Version 1: one JSON document per pchannel, read to migrate.

type fileStateV1 struct {
	Version   int                     `json:"version"`
	PChannel  message.PChannel        `json:"pchannel"`
	Resume    uint64                  `json:"resume_offset"`
	Handled   uint64                  `json:"handled_position"`
	Last      uint64                  `json:"last_broadcast_id"`
	LogID     string                  `json:"log_id,omitempty"`
	VChannels map[string]fileVStateV1 `json:"vchannels"`
	Applier   []byte                  `json:"applier"`
}

type fileVStateV1 struct {
	Applied uint64      `json:"applied"`
	Last    uint64      `json:"last_broadcast_id"`
	IDs     [][2]uint64 `json:"ids"`
}

// decodeStateV1 parses a state file of format version 1 of pchannel p.
func decodeStateV1(p message.PChannel, data []byte) (*pstate, []byte, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: pchannel %s: %s", ErrCorruptState, p, fmt.Sprintf(format, args...))
	}
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 {
		return nil, nil, corrupt("no header line")
	}
	header, body := string(data[:nl]), data[nl+1:]
	if len(header) != len(stateMagicV1)+9 || header[:len(stateMagicV1)] != stateMagicV1 || header[len(stateMagicV1)] != ' ' {
		return nil, nil, corrupt("bad header %q", header)
	}
	sum, err := strconv.ParseUint(header[len(stateMagicV1)+1:], 16, 32)
	if err != nil {
		return nil, nil, corrupt("bad checksum in header %q", header)
	}
	if got := crc32.Checksum(body, castagnoli); uint64(got) != sum {
		return nil, nil, corrupt("checksum mismatch: header %08x, body %08x", sum, got)
	}
	var f fileStateV1
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, nil, corrupt("%v", err)
	}
	if f.Version != 1 {
		return nil, nil, corrupt("unsupported version %d", f.Version)
	}
	if f.PChannel != p {
		return nil, nil, corrupt("file holds the state of pchannel %q", f.PChannel)
	}
	st := newPState()
	st.resume, st.handled, st.last, st.logID = f.Resume, f.Handled, f.Last, f.LogID
	for name, fv := range f.VChannels {
		v := message.VChannel(name)
		if err := v.Validate(); err != nil || v.PChannel() != p {
			return nil, nil, corrupt("vchannel %q is not hosted on the pchannel", name)
		}
		ids, err := idset.FromRanges(fv.IDs)
		if err != nil {
			return nil, nil, corrupt("vchannel %s: malformed id ranges", v)
		}
		st.putCold(v, (&vstate{ids: ids, applied: fv.Applied, last: fv.Last}).appendTo(nil))
	}
	return st, f.Applier, nil
}
