//go:build !walcast_mutate

package mutate

// Enabled says planted bugs are compiled in (the tag walcast_mutate).
const Enabled = false
