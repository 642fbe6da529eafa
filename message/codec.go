package message

import (
	"fmt"
)

// Marshal encodes m in walcast's durable format (the Message of
// proto/walcast/durable/v1/durable.proto).
func Marshal(m *Message) ([]byte, error) { return encode(m) }

// Unmarshal decodes a message written by Marshal. Bytes that do not decode,
// or decode to a message with an invalid domain or mode, give an error
// wrapping ErrCorrupt.
func Unmarshal(b []byte) (*Message, error) {
	m := &Message{}
	if err := decode(b, m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return m, nil
}
