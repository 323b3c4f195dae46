package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A shutdown grace given as zero or less, by flag, variable or config
// file, is refused naming where it was given: zero is how the
// configuration says "not set", so it became the 30s default unnoticed.
// Not given at all (an empty variable or key too), the default stands.
func TestShutdownGraceGivenAsZeroIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := fileIn(t, dir)
	zeroFile := file("zero.yaml", "shutdown_grace: 0s\n")
	negFile := file("negative.yaml", "shutdown_grace: -5s\n")
	emptyFile := file("empty.yaml", "shutdown_grace:\n")
	hugeFile := file("huge.yaml", "shutdown_grace: 3000000h\n")
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	for _, c := range []refusal{
		{[]string{noRedis}, []string{"worker", "--shutdown-grace", "0"}, `flag --shutdown-grace: "0" ` + graceHint},
		{nil, []string{"config", "--shutdown-grace=0s"}, `flag --shutdown-grace: "0s" ` + graceHint},
		{nil, []string{"config", "--shutdown-grace", "-1s"}, `flag --shutdown-grace: "-1s" ` + graceHint},
		{[]string{"KILN_SHUTDOWN_GRACE=0"}, []string{"config"}, `environment KILN_SHUTDOWN_GRACE: "0" ` + graceHint},
		{[]string{"KILN_SHUTDOWN_GRACE=0", noRedis}, []string{"worker"}, `environment KILN_SHUTDOWN_GRACE: "0" ` + graceHint},
		{nil, []string{"config", "--config", zeroFile}, "config file " + zeroFile + ": shutdown_grace: 0s " + graceHint},
		{nil, []string{"config", "--config", negFile}, "config file " + negFile + ": shutdown_grace: -5s is negative: give a duration such as 30s, or leave it unset for the default 30s"},
		// Past Go's range is said so, where it read "not a duration".
		{[]string{"KILN_SHUTDOWN_GRACE=3000000h"}, []string{"config"}, `environment KILN_SHUTDOWN_GRACE: "3000000h" is out of range: the longest duration is about 292 years (2562047h)`},
		{nil, []string{"config", "--shutdown-grace", "3000000h"}, `flag --shutdown-grace: "3000000h" is out of range: the longest duration is about 292 years (2562047h)`},
		{nil, []string{"config", "--config", hugeFile}, "config file " + hugeFile + ": line 1: shutdown_grace: 3000000h is out of range: the longest duration is about 292 years (2562047h)"},
	} {
		wantRefused(t, c.env, c.want, c.args...)
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"config"}, "30s"},
		{[]string{"KILN_SHUTDOWN_GRACE="}, []string{"config"}, "30s"},
		{nil, []string{"config", "--config", emptyFile}, "30s"},
		{[]string{"KILN_SHUTDOWN_GRACE=2m"}, []string{"config", "--config", zeroFile}, "2m0s"},
		{nil, []string{"config", "--config", zeroFile, "--shutdown-grace", "45s"}, "45s"},
	} {
		out, errOut, code := sched(t, c.env, c.args...)
		if code != 0 || !strings.Contains(out, "KILN_SHUTDOWN_GRACE  shutdown-grace   "+c.want+"\n") {
			t.Errorf("%v sched %v: exit %d, want grace %s\n%s%s", c.env, c.args, code, c.want, out, errOut)
		}
	}
}

// graceHint is what a refusal of a shutdown grace that is not positive
// says to give instead.
const graceHint = "is not positive: give a duration such as 30s, or leave it unset for the default 30s"

// refusal is a command (env and args) and what its one line says.
type refusal struct {
	env  []string
	args []string
	want string
}

// fileIn returns a function that writes a file of text named name in dir
// and returns its path.
func fileIn(t *testing.T, dir string) func(name, text string) string {
	return func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
}
