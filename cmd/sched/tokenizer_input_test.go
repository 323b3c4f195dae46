package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
)

// fifoOf makes a named pipe dir/name and, once a reader opens it, writes
// to it what write writes; the writer is waited for at the test's end,
// let go first where no reader ever opened the pipe.
func fifoOf(t *testing.T, dir, name string, write func(io.Writer)) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		defer f.Close()
		write(f)
	}()
	t.Cleanup(func() {
		// A reader's open, even one closed at once, ends the writer's;
		// its writes then fail, as they do once the command has gone.
		if r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			r.Close()
		}
		<-done
	})
	return path
}

// zeros writes NUL bytes, and no line break, until the reader goes away:
// /dev/zero through a pipe.
func zeros(w io.Writer) {
	b := make([]byte, 64<<10)
	for {
		if _, err := w.Write(b); err != nil {
			return
		}
	}
}

// wantBinaryRefused checks that a command given binary data in --in
// exited 2 with one line naming the input and the NUL byte's offset, and
// wrote nothing to out (which it then removes, for the next command).
func wantBinaryRefused(t *testing.T, args []string, command, in string, at int64, out string) {
	t.Helper()
	defer os.Remove(out)
	stdout, errOut, code := sched(t, nil, args...)
	want := command + ": --in " + in + " has a NUL byte at byte " + strconv.FormatInt(at, 10) + ", which no text has: it is binary data"
	if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, want) {
		t.Errorf("sched %s: exit %d\n%s%s\nwant exit 2 and one line containing %q", strings.Join(args, " "), code, stdout, errOut, want)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("sched %s wrote %s", strings.Join(args, " "), out)
	}
	if left, _ := filepath.Glob(out + ".tmp*"); len(left) > 0 {
		t.Errorf("sched %s left %v", strings.Join(args, " "), left)
	}
}

// tokenizer train of /dev/zero ran until it was killed, saying nothing:
// one endless line of NUL bytes, counted a chunk at a time. Binary data
// in any --in, a device, a pipe or a file, ends it at its first NUL byte
// with exit 2, naming that input; text from a pipe or from standard input
// still trains.
func TestTokenizerTrainRefusesBinaryInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	text := strings.Repeat("func main() { return x } the quick brown fox\n", 50)
	textFile := filepath.Join(dir, "text.txt")
	mixed := filepath.Join(dir, "mixed.txt")
	if err := os.WriteFile(textFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mixed, []byte(text+"\x00"+text), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "tokenizer.json")
	train := func(in string) []string {
		return []string{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", out}
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		wantBinaryRefused(t, train("/dev/zero"), "tokenizer train", "/dev/zero", 0, out)
	}
	nuls := fifoOf(t, dir, "zeros.fifo", zeros)
	wantBinaryRefused(t, train(nuls), "tokenizer train", nuls, 0, out)
	wantBinaryRefused(t, train(textFile+","+mixed), "tokenizer train", mixed, int64(len(text)), out)

	fifo := fifoOf(t, dir, "text.fifo", func(w io.Writer) { io.WriteString(w, text) })
	if _, errOut, code := sched(t, nil, train(fifo)...); code != 0 {
		t.Fatalf("tokenizer train --in %s (a pipe of text): exit %d: %s", fifo, code, errOut)
	}
	if _, err := tokenizer.Load(out); err != nil {
		t.Fatalf("tokenizer train of a pipe of text: %v", err)
	}
	stdinOut := filepath.Join(dir, "stdin.json")
	if _, errOut, code := schedIn(t, dir, []byte(text), "tokenizer", "train", "--in", "/dev/stdin", "--vocab", "300", "--out", stdinOut); code != 0 {
		t.Fatalf("tokenizer train --in /dev/stdin: exit %d: %s", code, errOut)
	}
	if _, err := tokenizer.Load(stdinOut); err != nil {
		t.Fatalf("tokenizer train of standard input: %v", err)
	}
}

// tokenize of /dev/zero held the text whole, waiting for a line break to
// cut it at, until memory ran out. Binary data ends it at a NUL byte with
// exit 2, naming --in: a device, a pipe, and a file whose pieces the
// workers read at their offsets, the NUL past the first of them.
func TestTokenizeRefusesBinaryInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const line = "func main() { return x } the quick brown fox\n"
	tokPath, _ := trainTestTokenizer(t, line)
	text := []byte(strings.Repeat(line, (3<<20)/len(line)))
	at := int64(len(text)/2 + 7) // within the second piece of a megabyte or so
	text[at] = 0
	bin := filepath.Join(dir, "text.bin")
	if err := os.WriteFile(bin, text, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "ids.bin")
	tokenize := func(in string) []string {
		return []string{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", out}
	}
	wantBinaryRefused(t, tokenize(bin), "tokenize", bin, at, out)
	if _, err := os.Stat("/dev/zero"); err == nil {
		wantBinaryRefused(t, tokenize("/dev/zero"), "tokenize", "/dev/zero", 0, out)
	}
	nuls := fifoOf(t, dir, "zeros.fifo", zeros)
	wantBinaryRefused(t, tokenize(nuls), "tokenize", nuls, 0, out)

	// The same file without its NUL, read at offsets through the check,
	// encodes to the whole text's ids.
	text[at] = 'x'
	if err := os.WriteFile(bin, text, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := sched(t, nil, append(tokenize(bin), "--dtype", "u32")...); code != 0 {
		t.Fatalf("tokenize %s: exit %d: %s", bin, code, errOut)
	}
	tk, err := tokenizer.Load(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, appendU32(nil, tk.EncodeBytes(text))) {
		t.Errorf("tokenize %s: %d bytes of ids, not the whole text's", bin, len(got))
	}
}
