// Package lapse folds a write that keeps failing, while a server is down,
// into the two log lines the person watching needs: the first failure,
// and the first success after it with how many failed in between.
package lapse

import "sync"

// Lapse counts the failures since the last success. Its zero value is
// ready; it is safe for concurrent use.
type Lapse struct {
	mu     sync.Mutex
	failed int
}

// Note records one attempt's outcome. first is true for the first failure
// after a success (or the first attempt); back is, for a success that ends
// a lapse, how many attempts failed in it, and zero otherwise.
func (l *Lapse) Note(err error) (first bool, back int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed++
		return l.failed == 1, 0
	}
	back, l.failed = l.failed, 0
	return false, back
}
