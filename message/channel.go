package message

import (
	"fmt"
	"strings"
)

// PChannel names a physical WAL partition: a JetStream subject, a Kafka
// partition, a local log. Appends to one pchannel are totally ordered.
//
// A pchannel name is 1 to 64 bytes of [A-Za-z0-9_-].
type PChannel string

// VChannel names a virtual channel hosted on exactly one pchannel, written
// "<pchannel>/<name>" (e.g. "wal-0/c100v1"). The name part is 1 to 128 bytes
// of [A-Za-z0-9_.-].
type VChannel string

// ControlName is the name part of a control channel: the control channel of
// pchannel p is "p/_control". Every broadcast also goes to the control channel
// (SPEC R2.2), and its position there orders ack callbacks (R5.4).
const ControlName = "_control"

// Validate reports whether p is a well-formed pchannel name.
func (p PChannel) Validate() error {
	if len(p) == 0 || len(p) > 64 {
		return fmt.Errorf("%w: pchannel %q must be 1 to 64 bytes", ErrInvalidChannel, string(p))
	}
	for i := 0; i < len(p); i++ {
		if !isChannelByte(p[i], false) {
			return fmt.Errorf("%w: pchannel %q has a byte outside [A-Za-z0-9_-]", ErrInvalidChannel, string(p))
		}
	}
	return nil
}

// Control returns the control channel hosted on p.
func (p PChannel) Control() VChannel { return VChannel(string(p) + "/" + ControlName) }

// NewVChannel returns the vchannel name on pchannel p, validated.
func NewVChannel(p PChannel, name string) (VChannel, error) {
	v := VChannel(string(p) + "/" + name)
	return v, v.Validate()
}

// Validate reports whether v is "<pchannel>/<name>" with both parts well formed.
func (v VChannel) Validate() error {
	i := strings.IndexByte(string(v), '/')
	if i < 0 {
		return fmt.Errorf("%w: vchannel %q is not <pchannel>/<name>", ErrInvalidChannel, string(v))
	}
	if err := PChannel(v[:i]).Validate(); err != nil {
		return fmt.Errorf("vchannel %q: %w", string(v), err)
	}
	name := v[i+1:]
	if len(name) == 0 || len(name) > 128 {
		return fmt.Errorf("%w: vchannel %q: name must be 1 to 128 bytes", ErrInvalidChannel, string(v))
	}
	for j := 0; j < len(name); j++ {
		if !isChannelByte(name[j], true) {
			return fmt.Errorf("%w: vchannel %q: name has a byte outside [A-Za-z0-9_.-]", ErrInvalidChannel, string(v))
		}
	}
	return nil
}

// PChannel returns the pchannel hosting v ("" if v is malformed).
func (v VChannel) PChannel() PChannel {
	if i := strings.IndexByte(string(v), '/'); i >= 0 {
		return PChannel(v[:i])
	}
	return ""
}

// Name returns the part of v after the pchannel.
func (v VChannel) Name() string {
	if i := strings.IndexByte(string(v), '/'); i >= 0 {
		return string(v[i+1:])
	}
	return ""
}

// IsControl reports whether v is a control channel.
func (v VChannel) IsControl() bool { return v.Name() == ControlName }

func isChannelByte(c byte, dot bool) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || dot && c == '.'
}
