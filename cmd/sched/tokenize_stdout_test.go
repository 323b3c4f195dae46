package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/tokenizer"
)

// schedToFile is sched with its standard output redirected to the file
// out, as a shell's > (or >> with appending) opens it.
func schedToFile(t *testing.T, out string, appending bool, args ...string) (stderr string, code int) {
	t.Helper()
	flags := os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	if appending {
		flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
	}
	f, err := os.OpenFile(out, flags, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = baseEnv(t)
	var e bytes.Buffer
	cmd.Stdout, cmd.Stderr = f, &e
	if err := cmd.Run(); err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return e.String(), code
}

// --out /dev/stdout with standard output redirected to a file (a regular
// file behind the device) writes the ids into that file, where the shell
// put it, with or without --force: it was renamed over /dev/stdout's name
// instead, which as root replaced the device's link in /dev by a file and
// left the redirected file empty (without --force, refused as an existing
// file). A link to /proc/self/fd/1 elsewhere stands for /dev/stdout where
// a replaced one would break this machine.
func TestOutputToRedirectedStandardOutputIsWrittenThere(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	text := "package main\n\nfunc main() {}\n"
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Load(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	want := appendU32(nil, tk.Encode(text))
	stdout := filepath.Join(dir, "stdout")
	if err := os.Symlink("/proc/self/fd/1", stdout); err != nil {
		t.Fatal(err)
	}
	ids := filepath.Join(dir, "ids.bin")
	for _, c := range []struct {
		out       string
		appending bool
		force     bool
		want      []byte
	}{
		{stdout, false, true, want},
		{stdout, true, false, append(append([]byte(nil), want...), want...)},
		{"/dev/stdout", false, false, want},
	} {
		args := []string{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", c.out, "--dtype", "u32"}
		if c.force {
			args = append(args, "--force")
		}
		errOut, code := schedToFile(t, ids, c.appending, args...)
		if code != 0 {
			t.Fatalf("sched %v > %s: exit %d: %s", args, ids, code, errOut)
		}
		if st, err := os.Lstat(stdout); err != nil || st.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("sched %v: %s is no longer the link to standard output: %v, %v", args, stdout, st, err)
		}
		if got, err := os.ReadFile(ids); err != nil || !bytes.Equal(got, c.want) {
			t.Fatalf("sched %v > %s: the file holds %d bytes (%v), want %d", args, ids, len(got), err, len(c.want))
		}
	}
	// tokenizer train writes its tokenizer.json there too.
	args := []string{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", stdout, "--force"}
	if errOut, code := schedToFile(t, ids, false, args...); code != 0 {
		t.Fatalf("sched %v: exit %d: %s", args, code, errOut)
	}
	if b, err := os.ReadFile(ids); err != nil {
		t.Fatal(err)
	} else if _, err := tokenizer.Parse(b); err != nil {
		t.Fatalf("what standard output got is not a tokenizer: %v", err)
	}
}
