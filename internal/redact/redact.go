// Package redact hides secrets in text that is printed or logged: the
// password of a URL, even one that does not parse, and known secret values
// wherever they appear (an error from a library may quote its input whole),
// a short one where it stands as a whole token.
package redact

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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

// shortSecret is the length under which a secret is masked only where it
// stands as a whole token. A secret of a few bytes (a Redis password "a")
// is part of ordinary words, numbers and addresses by chance: masked in
// each, the text would be unreadable, and the masks would spell out where
// the secret's letters were. From 8 bytes up a secret is not in a
// library's text by chance, so it is masked wherever it appears, run
// into other text too (pw=s3cretpass, an encoded string).
const shortSecret = 8

// Secrets replaces the occurrences in s of each non-empty secret with
// Mask: for error text from a library that quotes what it was given. A
// secret of 8 bytes or more is replaced wherever it appears; a shorter one
// only where it is a whole token, not joined to a letter or digit before
// or after it. A password in a URL stays masked whatever its length: its
// ':' or "//" before it and '@' after it bound it.
func Secrets(s string, secrets ...string) string {
	// The longest first: a short secret masked first could split a longer
	// one that holds it, leaving the rest of the longer one shown.
	secrets = slices.Clone(secrets)
	slices.SortStableFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, v := range secrets {
		if v == "" {
			continue
		}
		s = replace(s, v)
		// As %q writes it, escapes and all.
		if q := strconv.Quote(v); q[1:len(q)-1] != v {
			s = replace(s, q[1:len(q)-1])
		}
	}
	return s
}

// replace replaces v in s with Mask: everywhere, or for a short v only
// where it is a whole token.
func replace(s, v string) string {
	if len(v) >= shortSecret {
		return strings.ReplaceAll(s, v, Mask)
	}
	first, _ := utf8.DecodeRuneInString(v)
	last, _ := utf8.DecodeLastRuneInString(v)
	var b strings.Builder
	for from := 0; ; {
		i := strings.Index(s[from:], v)
		if i < 0 {
			if from == 0 {
				return s
			}
			b.WriteString(s[from:])
			return b.String()
		}
		i += from
		end := i + len(v)
		before, _ := utf8.DecodeLastRuneInString(s[:i])
		after, _ := utf8.DecodeRuneInString(s[end:])
		if wordRune(first) && wordRune(before) || wordRune(last) && wordRune(after) {
			// Part of a longer run of letters or digits: look again
			// from the next byte, for an occurrence that overlaps this
			// one ("aa" in "aaa aa").
			b.WriteString(s[from : i+1])
			from = i + 1
			continue
		}
		b.WriteString(s[from:i])
		b.WriteString(Mask)
		from = end
	}
}

// wordRune is a rune of a word: a letter or a digit. utf8.RuneError, which
// the edges of s decode to, is none.
func wordRune(r rune) bool {
	return r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r))
}
