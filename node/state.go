package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/walcast/walcast/message"
)

// idSet is a set of broadcast ids kept as sorted, disjoint, non-adjacent
// closed ranges. Ids are allocated densely, so the control channel (which
// gets every broadcast) stays a handful of ranges.
type idSet struct {
	r [][2]uint64
}

// search returns the index of the first range whose upper end is >= id.
func (s *idSet) search(id uint64) int {
	return sort.Search(len(s.r), func(i int) bool { return s.r[i][1] >= id })
}

func (s *idSet) has(id uint64) bool {
	i := s.search(id)
	return i < len(s.r) && s.r[i][0] <= id
}

// add inserts id and reports whether it was new.
func (s *idSet) add(id uint64) bool {
	i := s.search(id)
	if i < len(s.r) && s.r[i][0] <= id {
		return false
	}
	joinLeft := i > 0 && s.r[i-1][1] == id-1
	joinRight := i < len(s.r) && id != ^uint64(0) && s.r[i][0] == id+1
	switch {
	case joinLeft && joinRight:
		s.r[i-1][1] = s.r[i][1]
		s.r = append(s.r[:i], s.r[i+1:]...)
	case joinLeft:
		s.r[i-1][1] = id
	case joinRight:
		s.r[i][0] = id
	default:
		s.r = append(s.r, [2]uint64{})
		copy(s.r[i+1:], s.r[i:])
		s.r[i] = [2]uint64{id, id}
	}
	return true
}

// valid reports whether the ranges are well formed.
func (s *idSet) valid() bool {
	for i, r := range s.r {
		if r[0] == 0 || r[0] > r[1] {
			return false
		}
		if i > 0 && s.r[i-1][1]+1 >= r[0] {
			return false
		}
	}
	return true
}

// vstate is what the node records about one vchannel.
type vstate struct {
	ids     idSet
	applied uint64 // broadcasts applied
	last    uint64 // last broadcast id applied
}

// pstate is the durable state of one pchannel, minus the Applier's snapshot.
type pstate struct {
	// resume is the offset of the first entry not completely handled
	// (applied and acked).
	resume uint64
	// handled is the position of the last copy handled; copies at or below
	// it were applied (or were duplicates) in this state's lineage.
	handled uint64
	// last is the last broadcast id applied on the pchannel.
	last   uint64
	vchans map[message.VChannel]*vstate
}

func newPState() *pstate { return &pstate{vchans: make(map[message.VChannel]*vstate)} }

func (st *pstate) applied(v message.VChannel, id uint64) bool {
	vs := st.vchans[v]
	return vs != nil && vs.ids.has(id)
}

// stateVersion is the version of the state file format.
const stateVersion = 1

// stateMagic starts every state file; the header line is
// "<magic> <crc32c of the body, hex>\n" and the body is JSON.
const stateMagic = "walcast-node-state/1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type fileState struct {
	Version   int                   `json:"version"`
	Node      string                `json:"node"`
	PChannel  message.PChannel      `json:"pchannel"`
	Resume    uint64                `json:"resume_offset"`
	Handled   uint64                `json:"handled_position"`
	Last      uint64                `json:"last_broadcast_id"`
	VChannels map[string]fileVState `json:"vchannels"`
	Applier   []byte                `json:"applier"`
}

type fileVState struct {
	Applied uint64      `json:"applied"`
	Last    uint64      `json:"last_broadcast_id"`
	IDs     [][2]uint64 `json:"ids"`
}

// encodeState renders st and the Applier's snapshot as a state file.
func encodeState(node string, p message.PChannel, st *pstate, snap []byte) ([]byte, error) {
	f := fileState{Version: stateVersion, Node: node, PChannel: p, Resume: st.resume, Handled: st.handled,
		Last: st.last, VChannels: make(map[string]fileVState, len(st.vchans)), Applier: snap}
	for v, vs := range st.vchans {
		f.VChannels[string(v)] = fileVState{Applied: vs.applied, Last: vs.last, IDs: vs.ids.r}
	}
	body, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "%s %08x\n", stateMagic, crc32.Checksum(body, castagnoli))
	buf.Write(body)
	return buf.Bytes(), nil
}

// decodeState parses a state file of pchannel p.
func decodeState(p message.PChannel, data []byte) (*pstate, []byte, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: pchannel %s: %s", ErrCorruptState, p, fmt.Sprintf(format, args...))
	}
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 {
		return nil, nil, corrupt("no header line")
	}
	header, body := string(data[:nl]), data[nl+1:]
	if len(header) != len(stateMagic)+9 || header[:len(stateMagic)] != stateMagic || header[len(stateMagic)] != ' ' {
		return nil, nil, corrupt("bad header %q", header)
	}
	sum, err := strconv.ParseUint(header[len(stateMagic)+1:], 16, 32)
	if err != nil {
		return nil, nil, corrupt("bad checksum in header %q", header)
	}
	if got := crc32.Checksum(body, castagnoli); uint64(got) != sum {
		return nil, nil, corrupt("checksum mismatch: header %08x, body %08x", sum, got)
	}
	var f fileState
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, nil, corrupt("%v", err)
	}
	if f.Version != stateVersion {
		return nil, nil, corrupt("unsupported version %d", f.Version)
	}
	if f.PChannel != p {
		return nil, nil, corrupt("file holds the state of pchannel %q", f.PChannel)
	}
	st := newPState()
	st.resume, st.handled, st.last = f.Resume, f.Handled, f.Last
	for name, fv := range f.VChannels {
		v := message.VChannel(name)
		if err := v.Validate(); err != nil || v.PChannel() != p {
			return nil, nil, corrupt("vchannel %q is not hosted on the pchannel", name)
		}
		vs := &vstate{ids: idSet{r: fv.IDs}, applied: fv.Applied, last: fv.Last}
		if !vs.ids.valid() {
			return nil, nil, corrupt("vchannel %s: malformed id ranges", v)
		}
		st.vchans[v] = vs
	}
	return st, f.Applier, nil
}

func statePath(dir string, p message.PChannel) string {
	return filepath.Join(dir, string(p)+".state")
}

func tempPattern(p message.PChannel) string { return "." + string(p) + ".state.tmp-*" }

// loadState reads p's state file; ok is false if there is none.
func loadState(dir string, p message.PChannel) (st *pstate, snap []byte, ok bool, err error) {
	data, err := os.ReadFile(statePath(dir, p))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, nil
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("node: read state of %s: %w", p, err)
	}
	st, snap, err = decodeState(p, data)
	if err != nil {
		return nil, nil, false, err
	}
	return st, snap, true, nil
}

// removeTemps deletes temporary files a crashed save of p left behind.
func removeTemps(dir string, p message.PChannel) {
	names, _ := filepath.Glob(filepath.Join(dir, tempPattern(p)))
	for _, n := range names {
		_ = os.Remove(n)
	}
}

// writeAtomic replaces dir/name-of-p with data: write a temporary file,
// fsync it, rename it over the old file, fsync the directory.
func writeAtomic(dir string, p message.PChannel, data []byte) (err error) {
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
	if _, err = f.Write(data); err != nil {
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
	if err = os.Rename(tmp, statePath(dir, p)); err != nil {
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
