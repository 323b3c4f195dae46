// Package redact hides secrets in text that is printed or logged: the
// password of a URL, even one that does not parse, and known secret values
// wherever they appear (an error from a library may quote its input whole),
// a short one where it stands as a whole token.
package redact

import (
	"net/url"
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
// ':' or "//" before it and '@' after it bound it. Every secret is found in
// s as given, and the text they cover, overlapping or adjacent, becomes one
// Mask: a secret masked first never hides another's edge, nor makes one
// that followed it look joined to a word.
func Secrets(s string, secrets ...string) string {
	var hide []bool // hide[i]: byte i of s is a secret's
	mark := func(v string) {
		for from := 0; ; {
			i := strings.Index(s[from:], v)
			if i < 0 {
				return
			}
			i += from
			end := i + len(v)
			if len(v) >= shortSecret || wholeToken(s, i, end) {
				if hide == nil {
					hide = make([]bool, len(s))
				}
				for j := i; j < end; j++ {
					hide[j] = true
				}
			}
			// From the next byte: an occurrence may overlap this one
			// ("aa" in "aaa aa").
			from = i + 1
		}
	}
	for _, v := range secrets {
		if v == "" {
			continue
		}
		mark(v)
		// As %q writes it, escapes and all.
		if q := strconv.Quote(v); q[1:len(q)-1] != v {
			mark(q[1 : len(q)-1])
		}
	}
	if hide == nil {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && hide[j] == hide[i] {
			j++
		}
		if hide[i] {
			b.WriteString(Mask)
		} else {
			b.WriteString(s[i:j])
		}
		i = j
	}
	return b.String()
}

// wholeToken says whether s[i:end] stands as a whole token: neither end of
// it is a letter or digit joined to one beside it.
func wholeToken(s string, i, end int) bool {
	first, _ := utf8.DecodeRuneInString(s[i:end])
	last, _ := utf8.DecodeLastRuneInString(s[i:end])
	before, _ := utf8.DecodeLastRuneInString(s[:i])
	after, _ := utf8.DecodeRuneInString(s[end:])
	return !(wordRune(first) && wordRune(before) || wordRune(last) && wordRune(after))
}

// wordRune is a rune of a word: a letter or a digit. utf8.RuneError, which
// the edges of s decode to, is none.
func wordRune(r rune) bool {
	return r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r))
}

// Err is err with hide applied to its text, wrapping err still, so that
// errors.Is and errors.As see what it was: for errors from libraries and
// servers, which may quote a secret they were given. err itself where
// hide changes nothing (nil stays nil).
func Err(err error, hide func(string) string) error {
	if err == nil {
		return nil
	}
	if msg := hide(err.Error()); msg != err.Error() {
		return hiddenError{msg: msg, err: err}
	}
	return err
}

type hiddenError struct {
	msg string
	err error
}

func (e hiddenError) Error() string { return e.msg }
func (e hiddenError) Unwrap() error { return e.err }
