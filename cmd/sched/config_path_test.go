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
		// A relative XDG_CONFIG_HOME is ignored, as the XDG spec says.
		{[]string{"HOME=" + home, "XDG_CONFIG_HOME=rel/xdg"}, "from-home"},
	} {
		out, errOut, code := sched(t, c.env, "config")
		if code != 0 || !strings.Contains(out, "KILN_S3_BUCKET       s3-bucket        "+c.want+"\n") {
			t.Errorf("%v sched config: exit %d, want the bucket %s\n%s%s", c.env, code, c.want, out, errOut)
		}
	}
}

// A config file that cannot be read is refused in one line that says what
// named it (--config, KILN_CONFIG, or neither: the default path) and what
// to do; --config "" reads none, whatever KILN_CONFIG says, and a default
// file that does not exist is no error.
func TestAConfigFileThatCannotBeReadSaysWhatNamedIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.yaml")
	xdg := filepath.Join(dir, "xdg")
	// A directory where the default config file would be.
	if err := os.MkdirAll(filepath.Join(xdg, "kiln", "config.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"config", "--config", missing},
			"config file " + missing + ` (--config) does not exist: give the path of a YAML config file, or --config "" to read none`},
		{[]string{"KILN_CONFIG=" + missing}, []string{"config"},
			"config file " + missing + " (KILN_CONFIG) does not exist: set it to the path of a YAML config file, or unset it"},
		{nil, []string{"config", "--config", dir}, "config file " + dir + " (--config): read " + dir + ": is a directory: give the path"},
		{[]string{"XDG_CONFIG_HOME=" + xdg}, []string{"config"}, "config file " + filepath.Join(xdg, "kiln", "config.yaml") +
			` (read without --config or KILN_CONFIG): read ` + filepath.Join(xdg, "kiln", "config.yaml") + `: is a directory: make it a readable YAML file, remove it, or give --config "" to read none`},
	} {
		wantRefused(t, c.env, c.want, c.args...)
	}
	for _, c := range []struct {
		env  []string
		args []string
	}{
		{[]string{"KILN_CONFIG=" + missing}, []string{"config", "--config", ""}},
		{[]string{"XDG_CONFIG_HOME=" + xdg}, []string{"config", "--config="}},
		{[]string{"XDG_CONFIG_HOME=" + filepath.Join(dir, "empty")}, []string{"config"}},
	} {
		if out, errOut, code := sched(t, c.env, c.args...); code != 0 || !strings.Contains(out, "KILN_S3_BUCKET       s3-bucket        kiln\n") {
			t.Errorf("%v sched %q: exit %d; want no file read, the defaults\n%s%s", c.env, c.args, code, out, errOut)
		}
	}
}

// The config file read is --config's, else KILN_CONFIG's, else the one
// under XDG_CONFIG_HOME: each is read in place of those after it.
func TestTheConfigFileSearchOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, bucket string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("s3_bucket: "+bucket+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	file("xdg/kiln/config.yaml", "from-xdg")
	byEnv := file("env.yaml", "from-kiln-config")
	byFlag := file("flag.yaml", "from-flag")
	xdg := "XDG_CONFIG_HOME=" + filepath.Join(dir, "xdg")
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{xdg}, nil, "from-xdg"},
		{[]string{xdg, "KILN_CONFIG=" + byEnv}, nil, "from-kiln-config"},
		{[]string{xdg, "KILN_CONFIG=" + byEnv}, []string{"--config", byFlag}, "from-flag"},
	} {
		out, errOut, code := sched(t, c.env, append([]string{"config"}, c.args...)...)
		if code != 0 || !strings.Contains(out, "KILN_S3_BUCKET       s3-bucket        "+c.want+"\n") {
			t.Errorf("%v sched config %q: exit %d, want the bucket %s\n%s%s", c.env, c.args, code, c.want, out, errOut)
		}
	}
}
