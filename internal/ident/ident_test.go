package ident

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for s, want := range map[string]bool{
		"Collection": true, "db_1": true, "_": true, "9lives": true, strings.Repeat("a", 64): true,
		"": false, strings.Repeat("a", 65): false, "a-b": false, "a b": false, "a.b": false, "é": false,
	} {
		if got := Valid(s); got != want {
			t.Errorf("Valid(%q) = %v, want %v", s, got, want)
		}
	}
}
