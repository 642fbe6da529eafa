package jsonobj

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestMembersWriteWhatJSONMarshalWrites: after any mix of additions,
// value changes and resets, the object is byte for byte json.Marshal of the
// same map, keys that need escaping included.
func TestMembersWriteWhatJSONMarshalWrites(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"b", "a", "a-2", "c<d>", "é", "\"q\"", "z", "a_1", "", "k\u2028"}
	want := map[string]int{}
	var m Members[string]
	for step := range 500 {
		switch r := rng.IntN(10); {
		case r == 0:
			m.Reset()
			clear(want)
		default:
			k := names[rng.IntN(len(names))]
			if _, ok := want[k]; !ok {
				m.Add(k, k)
			}
			want[k] = rng.IntN(1000)
		}
		if m.Len() != len(want) {
			t.Fatalf("step %d: %d members, want %d", step, m.Len(), len(want))
		}
		if rng.IntN(3) > 0 {
			continue
		}
		got, err := m.Append([]byte("x"), func(k string) ([]byte, error) { return json.Marshal(want[k]) })
		if err != nil {
			t.Fatal(err)
		}
		exp, _ := json.Marshal(want)
		if string(got) != "x"+string(exp) {
			t.Fatalf("step %d:\n got %s\nwant x%s", step, got, exp)
		}
	}
}

func TestMembersValueErrorStops(t *testing.T) {
	var m Members[int]
	m.Add("a", 1)
	boom := fmt.Errorf("boom")
	if _, err := m.Append(nil, func(int) ([]byte, error) { return nil, boom }); err != boom {
		t.Fatalf("Append: %v, want the value's error", err)
	}
}
