//go:build !linux || race

package tokenizer

// mapsTables: shared tables are ordinary slices here (see the Linux
// version for why, and why not under the race detector).
const mapsTables = false

// sharedSlots returns n empty slots for s.
func sharedSlots(_ *sharedWords, n int) []sharedSlot { return make([]sharedSlot, n) }
