package client

import (
	"testing"

	"github.com/walcast/walcast/message"
)

// TestTypeNameIsTypeString: the name a request carries is the type's
// String, which the server parses back.
func TestTypeNameIsTypeString(t *testing.T) {
	for _, typ := range []message.Type{{Name: "CreateCollection", Version: 1}, {Name: "a.b", Version: 0}, {Name: "x", Version: 4294967295}, {}} {
		if got, want := typeName(typ), typ.String(); got != want {
			t.Errorf("typeName(%#v) = %q, want %q", typ, got, want)
		}
	}
}
