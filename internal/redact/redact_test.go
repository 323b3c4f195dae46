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
