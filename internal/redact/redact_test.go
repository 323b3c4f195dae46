package redact

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestURLHidesThePasswordOfAnySpelling(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:s3cret@localhost:6379/0":      "redis://:xxxxx@localhost:6379/0",
		"redis://:s3cret@localhost:63x9/0":      "redis://:xxxxx@localhost:63x9/0", // does not parse
		"redis://user:s3cret@h:1/0":             "redis://user:xxxxx@h:1/0",
		"rediss://u:s3:cr@t@h:1/0":              "rediss://u:xxxxx@h:1/0",
		"redis://s3cret@h:x/0":                  "redis://xxxxx@h:x/0",
		"http://admin:s3cret@minio:9000/kiln/k": "http://admin:xxxxx@minio:9000/kiln/k",
		"redis://localhost:6379/0":              "redis://localhost:6379/0",
		"redis//:s3cret@localhost:6379/0":       "redis//:xxxxx@localhost:6379/0",
		"redis://user@h:1/0":                    "redis://xxxxx@h:1/0",
		"localhost:6379":                        "localhost:6379",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A library's error that quotes a URL, here url.Parse's, loses the
// password however it is written.
func TestSecretsHidesQuotedPasswords(t *testing.T) {
	for _, raw := range []string{"redis://:s3cret@localhost:63x9/0", `redis://:s3"cr%2Fet@h:6x/0`} {
		_, err := url.Parse(raw)
		msg := fmt.Sprintf("KILN_REDIS_URL: %v (%q)", err, raw)
		got := Secrets(msg, Password(raw)...)
		for _, pw := range Password(raw) {
			if strings.Contains(got, pw) {
				t.Errorf("Secrets(%q) = %q: shows %q", msg, got, pw)
			}
		}
		if strings.Contains(got, "s3") {
			t.Errorf("Secrets(%q) = %q: shows part of the password", msg, got)
		}
	}
	if Password("redis://localhost:6379/0") != nil {
		t.Error("a URL without userinfo has no password")
	}
}

// A secret of a few bytes is masked where it stands as a whole token, not
// inside every word that holds its letters: a Redis password "a" masked in
// "dial" and "file" left the text unreadable, and the masks showed where
// each "a" was. A secret of 8 bytes or more is masked wherever it is.
func TestSecretsMasksAShortSecretOnlyAsAWholeToken(t *testing.T) {
	for _, c := range []struct {
		in, secret, want string
	}{
		{"dial tcp: a file", "a", "dial tcp: xxxxx file"},
		{"auth a failed", "a", "auth xxxxx failed"},
		{"dial tcp 127.0.0.1:6379: connect: connection refused", "a", "dial tcp 127.0.0.1:6379: connect: connection refused"},
		{"WRONGPASS invalid password 'a'", "a", "WRONGPASS invalid password 'xxxxx'"},
		{"password=a,user=b", "a", "password=xxxxx,user=b"},
		{"a", "a", "xxxxx"},
		{"a b a", "a", "xxxxx b xxxxx"},
		// Digits too: a port, an address, a count keep theirs.
		{"connect 6379 after 17 tries, said 7", "7", "connect 6379 after 17 tries, said xxxxx"},
		// Overlapping occurrences: the whole token is found after a part.
		{"aaa aa", "aa", "aaa xxxxx"},
		// Edges that are no letter or digit join nothing.
		{"auth x!a! y", "!a!", "auth xxxxxx y"},
		{"pw é1é", "1", "pw é1é"},
		{"pw é 1 é", "1", "pw é xxxxx é"},
		// A password in a URL is bounded by ':' or "//" and '@': masked
		// whatever its length.
		{`parse "redis://:a@localhost:63x9/0": invalid port ":63x9" after host`, "a", `parse "redis://:xxxxx@localhost:63x9/0": invalid port ":63x9" after host`},
		{"redis://user:a@h:1/0 and redis://a@h:1/0", "a", "redis://user:xxxxx@h:1/0 and redis://xxxxx@h:1/0"},
		// 8 bytes or more: everywhere, inside longer text too.
		{"auth failed for tokens3cretpass1x", "s3cretpass", "auth failed for tokenxxxxx1x"},
		{"key=abcdefgh12", "abcdefgh", "key=xxxxx12"},
	} {
		if got := Secrets(c.in, c.secret); got != c.want {
			t.Errorf("Secrets(%q, %q) = %q, want %q", c.in, c.secret, got, c.want)
		}
	}
	// As %q writes a short secret, escapes and all, in a whole token too.
	if got := Secrets(`auth "a\"" failed, "ab" ok`, `a"`); got != `auth "xxxxx" failed, "ab" ok` {
		t.Errorf("quoted short secret: %q", got)
	}
	// A short secret within a longer one does not split it: the longer
	// one is masked whole, whichever is given first.
	for _, order := range [][]string{{"a", "s3-a-cretpass"}, {"s3-a-cretpass", "a"}} {
		if got := Secrets("key s3-a-cretpass, pw a", order...); got != "key xxxxx, pw xxxxx" {
			t.Errorf("Secrets with %q: %q", order, got)
		}
	}
	// Each secret is found in the text as given: one masked before it,
	// ending in punctuation, does not make a short one after it look
	// joined to a word and leave it shown; adjacent secrets are one mask.
	for _, c := range []struct {
		in      string
		secrets []string
		want    string
	}{
		{"creds=AKIAs3cret/key+=pw9 end", []string{"AKIAs3cret/key+=", "pw9"}, "creds=xxxxx end"},
		{"creds=AKIAs3cret/key+=pw9 end", []string{"pw9", "AKIAs3cret/key+="}, "creds=xxxxx end"},
		{"auth p!q! ok", []string{"p!", "q!"}, "auth xxxxx ok"},
		{"auth p! q! ok", []string{"q!", "p!"}, "auth xxxxx xxxxx ok"},
	} {
		if got := Secrets(c.in, c.secrets...); got != c.want {
			t.Errorf("Secrets(%q, %q) = %q, want %q", c.in, c.secrets, got, c.want)
		}
	}
	// Each of several secrets, short and long.
	got := Secrets("user a with key s3cretkey9 at a.example", "a", "s3cretkey9")
	if want := "user xxxxx with key xxxxx at xxxxx.example"; got != want {
		t.Errorf("two secrets: %q, want %q", got, want)
	}
}
