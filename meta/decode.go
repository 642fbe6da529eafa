package meta

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
)

// decodeStrict decodes a payload of the service's types, refusing unknown
// fields. A payload type marked readOnly is decoded once per payload: in
// one process, the broadcaster's validator, the ack callback and each
// streaming node's Applier decode the same bytes, and the first decode is
// shared with the others (see recentDecodes).
func decodeStrict[P any](raw []byte) (P, error) {
	if _, ok := any((*P)(nil)).(readOnly); ok && len(raw) <= maxSharedPayload {
		if v, ok := recentDecodes.get(raw); ok {
			if p, ok := v.(P); ok {
				return p, nil
			}
		}
		p, err := decodeStrictOnce[P](raw)
		if err == nil {
			recentDecodes.put(raw, p)
		}
		return p, err
	}
	return decodeStrictOnce[P](raw)
}

func decodeStrictOnce[P any](raw []byte) (P, error) {
	var p P
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("payload: %w", err)
	}
	return p, nil
}

// readOnly marks a payload type whose decoded values no reader changes
// (their slices are shared): decodeStrict hands one decode of a payload to
// all its readers. A type is marked after checking every reader of it: its
// validator's check, its callback, the Applier. The service's own payloads
// of such a type are not decoded at all (sent): the value it encoded is
// what they decode to.
type readOnly interface{ readOnlyPayload() }

// The readers of a CreateCollection payload only read it. What the service
// sends decodes to what it encoded: numbers, names checked to be ASCII
// letters, digits and '_' (checkName), vchannels of validated pchannel
// names, field types from fieldTypes, non-empty slices, Fenced empty
// (TestCreateCollectionPayloadRoundTrips).
func (createCollectionPayload) readOnlyPayload() {}

// sent tells decodeStrict that raw, the service's encoding of payload p,
// decodes to p, if its type is readOnly: the broadcaster's validator, the
// callback and the streaming nodes of this process then find it decoded.
func sent(raw []byte, p any) {
	if _, ok := p.(readOnly); ok && len(raw) <= maxSharedPayload {
		recentDecodes.put(raw, p)
	}
}

// maxSharedPayload bounds the payloads recentDecodes keeps (and so its
// memory: about sharedDecodes times this, at most).
const maxSharedPayload = 4 << 10

// sharedDecodes is how many payloads recentDecodes keeps, the oldest
// forgotten first: enough for a payload's readers to find it while
// thousands of DDL per second go through.
const sharedDecodes = 1024

// recentDecodes keeps the latest payloads decoded, by their bytes: the
// same bytes decode to the same value, whichever reader decodes them.
var recentDecodes = newDecodeCache(sharedDecodes)

// decodeCache maps payload bytes to their decoded value, keeping the n
// added last.
type decodeCache struct {
	mu   sync.Mutex
	m    map[string]any // protected by mu
	ring []string       // the keys of m in the order added; protected by mu
	next int            // the slot of ring the next key takes; protected by mu
}

func newDecodeCache(n int) *decodeCache {
	return &decodeCache{m: make(map[string]any, n), ring: make([]string, n)}
}

func (c *decodeCache) get(raw []byte) (any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[string(raw)]
	return v, ok
}

// put adds raw's decoded value v, forgetting the oldest one if full. A key
// present already keeps its slot.
func (c *decodeCache) put(raw []byte, v any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[string(raw)]; ok {
		c.m[string(raw)] = v
		return
	}
	key := string(raw)
	if old := c.ring[c.next]; old != "" {
		delete(c.m, old)
	}
	c.ring[c.next] = key
	c.m[key] = v
	c.next = (c.next + 1) % len(c.ring)
}
