package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A path this user may not use (a data directory another user owns, a
// checkpoint another user wrote) is the user's to fix: exit 2, and the line
// names the path and says what to do; other failures keep exit 1.
func TestAPathThisUserMayNotUseIsBadInputThatSaysWhatToDo(t *testing.T) {
	var out bytes.Buffer
	denied := fmt.Errorf("ingest: %w", &fs.PathError{Op: "mkdir", Path: "/srv/kiln/.shards-1", Err: syscall.EACCES})
	if code := reportTo(&out, denied); code != exitBadInput {
		t.Errorf("permission denied: exit %d; want %d", code, exitBadInput)
	}
	line := out.String()
	for _, want := range []string{"mkdir /srv/kiln/.shards-1: permission denied", "run as the user that owns it, or give this one access", "KILN_DATA_DIR"} {
		if !strings.Contains(line, want) {
			t.Errorf("permission denied reads %q; want %q in it", line, want)
		}
	}
	if strings.Count(strings.TrimSpace(line), "\n") != 0 {
		t.Errorf("not one line: %q", line)
	}
	out.Reset()
	other := fmt.Errorf("ingest: %w", &fs.PathError{Op: "write", Path: "/srv/kiln/x", Err: syscall.EIO})
	if code := reportTo(&out, other); code != exitFailure || strings.Contains(out.String(), "give this one access") {
		t.Errorf("an I/O error: exit %d, %q; want exit %d without the advice on access", code, out.String(), exitFailure)
	}
}

// A flag's value the parser cannot read is named with what the flag
// takes, not with the Go function that refused it.
func TestAFlagValueThatDoesNotParseSaysWhatTheFlagTakes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"enqueue", "ingest", "fineweb-edu", "--seed", "-1"}, `--seed "-1" is not a whole number of 0 or more (see 'sched enqueue ingest --help')`},
		{[]string{"runs", "--limit", "abc"}, `--limit "abc" is not a whole number`},
		{[]string{"status", "--watch", "--interval", "5"}, `--interval "5" is not a duration such as 30s, 5m or 1h30m`},
		{[]string{"status", "--watch", "--interval", "99999999h"}, `--interval "99999999h" is out of range: the longest duration is about 292 years (2562047h) (see 'sched status --help')`},
		{[]string{"bench", "--steps", "99999999999999999999"}, `--steps "99999999999999999999" is out of range`},
	} {
		_, errOut, code := sched(t, nil, c.args...)
		if code != exitBadInput || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "strconv") {
			t.Errorf("sched %s: exit %d, %q; want exit 2 and %q", strings.Join(c.args, " "), code, errOut, c.want)
		}
	}
}

// A file whose name carries escape sequences (a dataset's owner chose it)
// is named in the error with them escaped: printed raw, they set the
// terminal's title and colours and cleared its screen.
func TestAnErrorNamingAFileEscapesItsControlCharacters(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	name := "evil\x1b]0;pwned\a\x1b[2Jx.jsonl"
	if err := os.WriteFile(filepath.Join(dir, name), []byte("{not json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := sched(t, nil, "datasets", "check", "local:"+filepath.Join(dir, "*.jsonl"))
	if code != exitBadInput || strings.ContainsAny(errOut, "\x1b\a") || !strings.Contains(errOut, `evil\x1b]0;pwned\a\x1b[2Jx.jsonl`) {
		t.Fatalf("datasets check of a file named %q: exit %d, %q; want exit 2 naming it with its escapes written out", name, code, errOut)
	}
	var out bytes.Buffer
	reportTo(&out, fmt.Errorf("a\tb\u0085c\x7fd"))
	if got := out.String(); got != "sched: a\tb\\u0085c\\x7fd\n" {
		t.Errorf("reportTo: %q", got)
	}
}
