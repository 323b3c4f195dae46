package scheduler

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestConfigLocalRootsDefaultToTheDataDir(t *testing.T) {
	c := Config{DataDir: "/srv/kiln"}.WithDefaults()
	if len(c.LocalRoots) != 1 || c.LocalRoots[0] != "/srv/kiln" {
		t.Fatalf("LocalRoots = %q; want the data directory alone", c.LocalRoots)
	}
	c = Config{DataDir: "/srv/kiln", LocalRoots: []string{"/corpus", "/more"}}.WithDefaults()
	if len(c.LocalRoots) != 2 || c.Validate() != nil {
		t.Fatalf("LocalRoots = %q, %v; want them kept", c.LocalRoots, c.Validate())
	}
	c.LocalRoots = []string{"/corpus", ""}
	var ce *ConfigError
	if err := c.Validate(); !errors.As(err, &ce) || ce.Env != "KILN_LOCAL_ROOTS" {
		t.Fatalf("an empty root: %v; want a ConfigError naming KILN_LOCAL_ROOTS", err)
	}
}

// A malformed Redis URL (a port typo) is refused naming the setting, and
// neither the error nor the masked configuration shows its password.
func TestConfigNeverShowsTheRedisPassword(t *testing.T) {
	for _, u := range []string{"redis://:s3cret@localhost:63x9/0", "redis://user:s3cret@localhost:6379/x", "redis//:s3cret@localhost:6379/0", "redis://:s3cret@localhost:6379/0"} {
		c := Config{RedisURL: u, S3SecretKey: "k3y", HFToken: "hf_tok"}.WithDefaults()
		err := c.Validate()
		text := fmt.Sprintf("%v %+v", err, c.Masked())
		for _, secret := range []string{"s3cret", "k3y", "hf_tok"} {
			if strings.Contains(text, secret) {
				t.Errorf("%s: %q shows %q", u, text, secret)
			}
		}
		if u != "redis://:s3cret@localhost:6379/0" && (err == nil || !strings.Contains(err.Error(), "KILN_REDIS_URL")) {
			t.Errorf("%s: Validate = %v; want an error naming KILN_REDIS_URL", u, err)
		}
		// A library error quoting the URL loses the password too.
		_, perr := url.Parse(u)
		lib := fmt.Sprintf("%v; %q; key k3y; token hf_tok", perr, u)
		if got := c.Redact(lib); strings.Contains(got, "s3cret") || strings.Contains(got, "k3y") || strings.Contains(got, "hf_tok") {
			t.Errorf("Redact(%q) = %q", lib, got)
		}
	}
	if err := (Config{RedisURL: "redis://:pw@localhost:63x9/0"}.WithDefaults()).Validate(); err == nil || !strings.Contains(err.Error(), "port") {
		t.Errorf("a port typo: %v; want the reason named", err)
	}
}
