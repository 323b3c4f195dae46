package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// schedIn is sched run in the working directory dir, with stdin as its
// standard input.
func schedIn(t *testing.T, dir string, stdin []byte, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env, cmd.Dir, cmd.Stdin = baseEnv(t), dir, bytes.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// '-' given to --in or --out of tokenize (and tokenizer train) was a file
// of that name in the working directory, where standard input or output
// was meant. It is refused, naming /dev/stdin and /dev/stdout, which do
// work: the help says a device is read and written in place.
func TestTokenizeRefusesDashAndNamesTheStandardStreams(t *testing.T) {
	t.Parallel()
	const text = "func main() { return x } the quick brown fox\n"
	tokJSON, _ := trainTestTokenizer(t, text)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "text.txt"), []byte(strings.Repeat(text, 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tokenize", "--tokenizer-file", tokJSON, "--in", "text.txt", "--out", "-"}, "--out -: tokenize writes files, and '-' would be a file named '-' here; to write to standard output, through a pipe, give --out /dev/stdout"},
		{[]string{"tokenize", "--tokenizer-file", tokJSON, "--in", "-", "--out", "ids.bin"}, "--in -: tokenize reads files, and '-' would be a file named '-' here; to read standard input, give --in /dev/stdin"},
		{[]string{"tokenizer", "train", "--in", "text.txt,-", "--vocab", "260", "--out", "t.json"}, "--in -: tokenizer train reads files"},
		{[]string{"tokenizer", "train", "--in", "text.txt", "--vocab", "260", "--out", "-"}, "--out -: tokenizer train writes files"},
	} {
		out, errOut, code := schedIn(t, dir, []byte(text), c.args...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("sched %v: exit %d\n%s%s\nwant exit 2 and one line containing %q", c.args, code, out, errOut, c.want)
		}
		if _, err := os.Lstat(filepath.Join(dir, "-")); err == nil {
			t.Fatalf("sched %v left a file named '-' in its working directory", c.args)
		}
	}
	// The streams the messages name: text on standard input, ids on
	// standard output (a pipe here), as many as from the file.
	ids, errOut, code := schedIn(t, dir, []byte(strings.Repeat(text, 20)), "tokenize", "--tokenizer-file", tokJSON, "--in", "/dev/stdin", "--out", "/dev/stdout")
	if code != 0 {
		t.Fatalf("tokenize --in /dev/stdin --out /dev/stdout: exit %d: %s", code, errOut)
	}
	if _, errOut, code := schedIn(t, dir, nil, "tokenize", "--tokenizer-file", tokJSON, "--in", "text.txt", "--out", "ids.bin"); code != 0 {
		t.Fatalf("tokenize --in text.txt --out ids.bin: exit %d: %s", code, errOut)
	}
	if want, err := os.ReadFile(filepath.Join(dir, "ids.bin")); err != nil || len(want) == 0 || ids != string(want) {
		t.Errorf("ids on standard output (%d bytes) differ from those of the file (%d bytes, %v)", len(ids), len(want), err)
	}
}
