// Package durlimit tells a duration past Go's range from one written
// wrong: time.ParseDuration refuses both in the same words ("invalid
// duration"), so a user who typed 3000000h read that it was not a
// duration at all.
package durlimit

import (
	"regexp"
	"time"
)

// Longest says the longest duration there is, for a message.
const Longest = "the longest duration is about 292 years (2562047h)"

// written is a duration written as time.ParseDuration reads one, whatever
// its size.
var written = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// Past reports whether s is written as a duration but time.ParseDuration
// refuses it, which leaves only its size.
func Past(s string) bool {
	if !written.MatchString(s) {
		return false
	}
	_, err := time.ParseDuration(s)
	return err != nil
}
