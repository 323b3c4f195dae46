package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The help names the config file read when neither --config nor
// KILN_CONFIG is given as the code finds it: under XDG_CONFIG_HOME when
// that is set, where it once named ~/.config alone.
func TestConfigFileDefaultIsWhereTheHelpSays(t *testing.T) {
	t.Parallel()
	help, errOut, code := sched(t, nil, "--help")
	if code != 0 || !strings.Contains(help, "$XDG_CONFIG_HOME/kiln/config.yaml if present; XDG_CONFIG_HOME defaults to ~/.config") {
		t.Fatalf("sched --help: exit %d; want the config file under $XDG_CONFIG_HOME named\n%s%s", code, help, errOut)
	}
	home := t.TempDir()
	xdg := filepath.Join(t.TempDir(), "xdg")
	write := func(dir, bucket string) {
		if err := os.MkdirAll(filepath.Join(dir, "kiln"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "kiln", "config.yaml"), []byte("s3_bucket: "+bucket+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(home, ".config"), "from-home")
	write(xdg, "from-xdg")
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"HOME=" + home, "XDG_CONFIG_HOME=" + xdg}, "from-xdg"},
		{[]string{"HOME=" + home, "XDG_CONFIG_HOME="}, "from-home"},
	} {
		out, errOut, code := sched(t, c.env, "config")
		if code != 0 || !strings.Contains(out, "KILN_S3_BUCKET       s3-bucket        "+c.want+"\n") {
			t.Errorf("%v sched config: exit %d, want the bucket %s\n%s%s", c.env, code, c.want, out, errOut)
		}
	}
}
