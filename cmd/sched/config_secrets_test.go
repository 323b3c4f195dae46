package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// No output of sched shows a password, whatever the mistake in the URL
// that carries it: a port typo, a URL that does not parse, a Redis that
// refuses the password, an S3 endpoint written with credentials in it.
func TestSecretsAppearInNoOutput(t *testing.T) {
	t.Parallel()
	redis := testsvc.Redis(t)
	const secret = "s3cretPw"
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"port typo, config", []string{"KILN_REDIS_URL=redis://:" + secret + "@localhost:63x9/0"}, []string{"config"}, "KILN_REDIS_URL"},
		{"port typo, status", []string{"KILN_REDIS_URL=redis://:" + secret + "@localhost:63x9/0"}, []string{"status"}, "port"},
		{"port typo, worker", []string{"KILN_REDIS_URL=redis://:" + secret + "@localhost:63x9/0"}, []string{"worker", "--queues", "ingest=1"}, "KILN_REDIS_URL"},
		{"port typo, flag", nil, []string{"enqueue", "ingest", "the-stack-v2", "--redis-url", "redis://user:" + secret + "@localhost:6379x/0"}, "--redis-url"},
		{"no scheme", []string{"KILN_REDIS_URL=redis//:" + secret + "@localhost:6379/0"}, []string{"status"}, "KILN_REDIS_URL"},
		{"bad database", []string{"KILN_REDIS_URL=redis://:" + secret + "@localhost:6379/zero"}, []string{"status"}, "database"},
		{"unreachable", []string{"KILN_REDIS_URL=redis://:" + secret + "@127.0.0.1:1/0"}, []string{"status"}, "cannot reach Redis"},
		{"s3 endpoint with credentials", []string{"KILN_REDIS_URL=redis://" + redis + "/0", "KILN_S3_ENDPOINT=admin:" + secret + "@127.0.0.1:1",
			"KILN_S3_ACCESS_KEY=ak", "KILN_S3_SECRET_KEY=" + secret}, []string{"config", "--check"}, "KILN_S3_ENDPOINT"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out, errOut, code := sched(t, c.env, c.args...)
			if code != exitBadInput || !strings.Contains(errOut, c.want) {
				t.Fatalf("sched %v: exit %d, stderr %q; want exit 2 and %q", c.args, code, errOut, c.want)
			}
			if strings.Contains(out+errOut, secret) {
				t.Fatalf("sched %v shows the password:\nstdout %q\nstderr %q", c.args, out, errOut)
			}
		})
	}
	// The configuration itself, printed and checked against a Redis that
	// has no password, masks it too.
	out, errOut, code := sched(t, []string{"KILN_REDIS_URL=redis://:" + secret + "@" + redis + "/0", "KILN_LOCAL_ROOTS=/corpus:/more"}, "config", "--check")
	if strings.Contains(out+errOut, secret) || !strings.Contains(out, "/corpus:/more") || !strings.Contains(out, ":xxxxx@") {
		t.Fatalf("sched config --check: exit %d\n%s%s", code, out, errOut)
	}
}

// The Docker day's first line makes .env, which holds the passwords,
// readable by its owner alone, as operations.md's "Security" says it is:
// a plain cp of .env.example leaves it readable by every user of the host
// (umask 022).
func TestTheDockerDaysEnvIsReadableByItsOwnerAlone(t *testing.T) {
	t.Parallel()
	var line string
	for _, l := range readmeBlock(t, "## The user's day (with Docker)") {
		if cmd, _, _ := strings.Cut(l, "#"); strings.Contains(cmd, ".env.example") {
			line = strings.TrimSpace(cmd)
			break
		}
	}
	if line == "" {
		t.Fatal("the Docker day makes no .env from .env.example")
	}
	example, err := os.ReadFile("../../.env.example")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ".env.example"), example, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", "umask 022\n"+line)
	cmd.Dir = dir
	cmd.Env = append(baseEnv(t), "EDITOR=true")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	st, err := os.Stat(filepath.Join(dir, ".env"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ".env")); st.Mode().Perm() != 0o600 || !bytes.Equal(b, example) {
		t.Fatalf("%s made .env of mode %v; want .env.example's lines, mode 0600", line, st.Mode().Perm())
	}
}
