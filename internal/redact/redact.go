// Package redact hides secrets in text that is printed or logged: the
// password of a URL, even one that does not parse, and known secret values
// wherever they appear (an error from a library may quote its input whole).
package redact

import (
	"net/url"
	"strconv"
	"strings"
)

// Mask replaces a password in printed text.
const Mask = "xxxxx"

// URL returns s with the password of its userinfo replaced by Mask. A
// string that url.Parse refuses (a port typo: redis://:pw@host:63x9/0) is
// masked by its spelling: everything between "://" and the last '@' is
// taken as userinfo, which may hide more than the password but never less.
func URL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), Mask)
			return u.String()
		}
	}
	// Not a URL with a password as url.Parse sees it: a user alone (which
	// may be a password written without its colon), or a string it reads
	// as a path (redis//:pw@host), or one it refuses.
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + len("://")
	}
	rest := s[start:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return s
	}
	name, _, hasPassword := strings.Cut(rest[:at], ":")
	if !hasPassword {
		// No colon: the whole userinfo may be a password written without
		// its user (redis://s3cret@host).
		return s[:start] + Mask + rest[at:]
	}
	return s[:start] + name + ":" + Mask + rest[at:]
}

// Password returns the password that s (a URL, well-formed or not) carries,
// as written and decoded, for Secrets; nothing when it has none.
func Password(s string) []string {
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + len("://")
	}
	rest := s[start:]
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return nil
	}
	user := rest[:at]
	if _, pw, ok := strings.Cut(user, ":"); ok {
		user = pw
	}
	if user == "" {
		return nil
	}
	out := []string{user}
	if dec, err := url.PathUnescape(user); err == nil && dec != user {
		out = append(out, dec)
	}
	return out
}

// Secrets replaces every occurrence in s of each non-empty secret with
// Mask: for error text from a library that quotes what it was given.
func Secrets(s string, secrets ...string) string {
	for _, v := range secrets {
		if v == "" {
			continue
		}
		s = strings.ReplaceAll(s, v, Mask)
		// As %q writes it, escapes and all.
		if q := strconv.Quote(v); q[1:len(q)-1] != v {
			s = strings.ReplaceAll(s, q[1:len(q)-1], Mask)
		}
	}
	return s
}
