// Package shell writes arguments of the commands kiln's messages suggest,
// so that one pasted into a POSIX shell names the same path.
package shell

import (
	"regexp"
	"strings"
)

// plain is an argument a shell reads as it is written.
var plain = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

// Quote returns s as one shell word: as it is where nothing in it is
// special to a shell, in double quotes where only spaces and the like are,
// and in single quotes otherwise.
func Quote(s string) string {
	switch {
	case plain.MatchString(s):
		return s
	case !strings.ContainsAny(s, "\"$`\\!\n"):
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
