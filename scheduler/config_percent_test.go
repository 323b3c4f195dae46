package scheduler

import (
	"errors"
	"strings"
	"testing"
)

// A '%' in a Redis URL's password that begins no escape ("%ZZ", or one
// at its end) makes the URL unparsable: the error says to write it %25,
// without the password; a '%' elsewhere gets no word of a password.
func TestAPercentInTheRedisPasswordIsToldToBeEncoded(t *testing.T) {
	const hint = "its password holds a '%' that begins no escape such as %2F: percent-encode each '%' of it as %25 (and '/', '?', '#' as %2F, %3F, %23)"
	for _, c := range []struct {
		url, secret string
		hint        bool
	}{
		{"redis://:Wr%ZZpw@127.0.0.1:6379/0", "Wr%ZZpw", true},
		{"redis://kiln:s3cret%@127.0.0.1:6379/0", "s3cret", true},
		{"redis://127.0.0.1%zz:6379/0", "", false},
	} {
		err := Config{RedisURL: c.url}.WithDefaults().Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Env != "KILN_REDIS_URL" || strings.Contains(err.Error(), hint) != c.hint {
			t.Errorf("%s: %v; want KILN_REDIS_URL refused, with the hint %q: %v", c.url, err, hint, c.hint)
		}
		if c.secret != "" && strings.Contains(err.Error(), c.secret) {
			t.Errorf("%s: %v shows the password", c.url, err)
		}
	}
}
