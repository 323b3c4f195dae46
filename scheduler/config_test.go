package scheduler

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
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

// A Redis password of one letter is masked in a library's error where it
// stands alone and in the URL, not in every word that holds the letter;
// a long secret is masked inside longer text too.
func TestRedactMasksAShortPasswordOnlyAsAWholeToken(t *testing.T) {
	c := Config{RedisURL: "redis://:a@localhost:6379/0", S3SecretKey: "s3cret-key-0123", HFToken: "hf_a"}.WithDefaults()
	lib := `dial tcp: lookup redis on 127.0.0.11:53: no such host (redis://:a@localhost:6379/0); AUTH a failed; key=s3cret-key-0123x; token hf_a`
	want := `dial tcp: lookup redis on 127.0.0.11:53: no such host (redis://:xxxxx@localhost:6379/0); AUTH xxxxx failed; key=xxxxxx; token xxxxx`
	if got := c.Redact(lib); got != want {
		t.Errorf("Redact(%q)\n = %q\nwant %q", lib, got, want)
	}
}

// A malformed S3 endpoint is refused naming KILN_S3_ENDPOINT and giving a
// valid value, before minio-go's parser quotes it as a URL.
func TestConfigRefusesAMalformedS3Endpoint(t *testing.T) {
	base := Config{S3AccessKey: "ak", S3SecretKey: "sk"}
	for _, e := range []string{"minio:9000", "127.0.0.1:9000", "s3.example.com", "s3.example.com.", "kiln_minio_1:9000", "[::1]:9000", "[::1]"} {
		c := base
		c.S3Endpoint = e
		if err := c.WithDefaults().Validate(); err != nil {
			t.Errorf("%q: %v; want it taken", e, err)
		}
	}
	for e, why := range map[string]string{
		"garbage host:xx": "it has a space in it",
		"minio:xx":        `port "xx" is not a number from 1 to 65535`,
		"minio:":          `port "" is not a number`,
		"minio:99999":     `port "99999" is not a number`,
		"::1:9000":        "an IPv6 address goes in brackets",
		":9000":           "it has no host",
		"-minio:9000":     `host "-minio" is not a host name`,
		"min!o:9000":      `host "min!o" is not a host name`,
		"minio..lan:9000": `host "minio..lan" is not a host name`,
		"minio:9000\t":    "it has a space in it",
	} {
		c := base
		c.S3Endpoint = e
		err := c.WithDefaults().Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Env != "KILN_S3_ENDPOINT" || !strings.Contains(err.Error(), "KILN_S3_ENDPOINT (--s3-endpoint): ") ||
			!strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "e.g. minio:9000") {
			t.Errorf("%q: %v; want a ConfigError naming KILN_S3_ENDPOINT, saying %q and giving an example", e, err, why)
		}
	}
}

// A data directory that is a file, or under one, is refused naming
// KILN_DATA_DIR, not at the first mkdir; one that does not exist is taken
// (kiln creates it).
func TestConfigRefusesADataDirThatIsAFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "corpus.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "new", "data")} {
		if err := (Config{DataDir: d}.WithDefaults()).Validate(); err != nil {
			t.Errorf("%s: %v; want it taken", d, err)
		}
	}
	for d, why := range map[string]string{file: "is a file, not a directory", filepath.Join(file, "data"): "is under a file, not a directory"} {
		err := Config{DataDir: d}.WithDefaults().Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Env != "KILN_DATA_DIR" || !strings.Contains(err.Error(), "KILN_DATA_DIR (--data-dir): ") ||
			!strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "point it at a directory") {
			t.Errorf("%s: %v; want a ConfigError naming KILN_DATA_DIR and saying it %s", d, err, why)
		}
	}
}
