package node

import (
	"fmt"

	"github.com/walcast/walcast/message"
)

// Resync makes the saved state of pchannel p in stateDir (a stopped node's)
// read the log again from its start: it keeps the Applier's state and the
// broadcast ids applied per vchannel, and forgets the log position and the
// identity of the log it belonged to. Run it when the pchannel halted
// because its log is not the one its position belongs to (the stream or
// topic was recreated, or the broker lost entries, R9.14): on the next
// start the node reads the log from its beginning, applies the copies whose
// broadcast it has not applied, and acks every copy again (acks of finished
// broadcasts change nothing). It reports whether p had a saved state
// (without one the node starts from the beginning anyway).
func Resync(stateDir, nodeName string, p message.PChannel) (bool, error) {
	if err := p.Validate(); err != nil {
		return false, fmt.Errorf("%w: pchannel: %w", ErrInvalidConfig, err)
	}
	removeTemps(stateDir, p)
	s, ok, err := loadState(stateDir, p)
	if err != nil || !ok {
		return false, err
	}
	// The position and the log it belongs to are forgotten: the next start
	// reads the log there is from its start, and takes its identity.
	s.st.resume, s.st.handled, s.st.logID = 0, 0, ""
	apps := func(v message.VChannel) ([]byte, error) {
		app, _ := s.apps.Get(string(v))
		return app, nil
	}
	data, err := encodeBase(nodeName, p, s.gen+1, s.st, apps, s.whole)
	if err != nil {
		return true, fmt.Errorf("node: encode the state of %s: %w", p, err)
	}
	j, err := writeBase(stateDir, nodeName, p, s.gen+1, data)
	if err != nil {
		return true, fmt.Errorf("node: save the state of %s: %w", p, err)
	}
	return true, j.close()
}
