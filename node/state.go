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
	"strconv"

	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/internal/jsonobj"
	"github.com/walcast/walcast/message"
)

// vstate is what the node records about one vchannel.
type vstate struct {
	ids     idset.Set // the broadcasts applied, as ranges (dense ids stay a handful)
	applied uint64    // broadcasts applied
	last    uint64    // last broadcast id applied
	// enc is the vchannel's value in the state file's "vchannels" object,
	// nil once the fields above changed (see changed).
	enc []byte
}

// changed says that vs's fields changed since its last encoding.
func (vs *vstate) changed() { vs.enc = nil }

// pstate is the durable state of one pchannel, minus the Applier's snapshot.
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
	logID  string
	vchans map[message.VChannel]*vstate
	// members are vchans as the state file lists them.
	members jsonobj.Members[*vstate]
}

// add records a new vchannel's state (vchannels are never removed).
func (st *pstate) add(v message.VChannel, vs *vstate) {
	st.vchans[v] = vs
	st.members.Add(string(v), vs)
}

func newPState() *pstate { return &pstate{vchans: make(map[message.VChannel]*vstate)} }

func (st *pstate) applied(v message.VChannel, id uint64) bool {
	vs := st.vchans[v]
	return vs != nil && vs.ids.Has(id)
}

// stateVersion is the version of the state file format.
const stateVersion = 1

// stateMagic starts every state file; the header line is
// "<magic> <crc32c of the body, hex>\n" and the body is JSON.
const stateMagic = "walcast-node-state/1"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type fileState struct {
	fileHead
	VChannels map[string]fileVState `json:"vchannels"`
	Applier   []byte                `json:"applier"`
}

// fileHead is fileState's fields before VChannels, which encodeState
// marshals alone and follows with the rest.
type fileHead struct {
	Version  int              `json:"version"`
	Node     string           `json:"node"`
	PChannel message.PChannel `json:"pchannel"`
	Resume   uint64           `json:"resume_offset"`
	Handled  uint64           `json:"handled_position"`
	Last     uint64           `json:"last_broadcast_id"`
	LogID    string           `json:"log_id,omitempty"`
}

type fileVState struct {
	Applied uint64      `json:"applied"`
	Last    uint64      `json:"last_broadcast_id"`
	IDs     [][2]uint64 `json:"ids"`
}

// encodeState encodes st with the Applier's snapshot: the bytes of
// json.Marshal of its fileState, built from the vchannels' kept encodings,
// so that a save re-encodes only the vchannels that changed since the last.
func encodeState(node string, p message.PChannel, st *pstate, snap []byte) ([]byte, error) {
	head, err := json.Marshal(fileHead{Version: stateVersion, Node: node, PChannel: p, Resume: st.resume, Handled: st.handled, Last: st.last, LogID: st.logID})
	if err != nil {
		return nil, err
	}
	applier, err := json.Marshal(snap)
	if err != nil {
		return nil, err
	}
	body := make([]byte, 0, len(head)+len(applier)+st.members.Size()+32)
	body = append(body, head[:len(head)-1]...) // without its "}"
	body = append(body, `,"vchannels":`...)
	if body, err = st.members.Append(body, (*vstate).encoded); err != nil {
		return nil, err
	}
	body = append(body, `,"applier":`...)
	body = append(body, applier...)
	body = append(body, '}')
	out := make([]byte, 0, len(stateMagic)+10+len(body))
	out = fmt.Appendf(out, "%s %08x\n", stateMagic, crc32.Checksum(body, castagnoli))
	return append(out, body...), nil
}

// encoded is vs's value in the "vchannels" object, kept until it changes.
func (vs *vstate) encoded() ([]byte, error) {
	if vs.enc == nil {
		enc, err := json.Marshal(fileVState{Applied: vs.applied, Last: vs.last, IDs: vs.ids.Ranges()})
		if err != nil {
			return nil, err
		}
		vs.enc = enc
	}
	return vs.enc, nil
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
		st.add(v, &vstate{ids: ids, applied: fv.Applied, last: fv.Last})
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
