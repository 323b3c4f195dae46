package tokenizer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// wantBadInput fails unless err is a bad-input error whose one line says
// each of want.
func wantBadInput(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	var b interface{ BadInput() bool }
	if err == nil || !errors.As(err, &b) || !b.BadInput() || strings.Contains(err.Error(), "\n") {
		t.Fatalf("%s: err = %v; want a one-line bad-input error", what, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", what, err, w)
		}
	}
}

// A file larger than the cap is refused naming it, whatever it is: a
// regular file (by its size, unread), /dev/zero and a pipe that never
// ends (read only to one byte past the cap); a tokenizer.json of exactly
// the cap still loads.
func TestLoadRefusesAFileLargerThanTheCap(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "tokenizer.json")
	data := readTestdata(t, "gpt2-style.tokenizer.json")
	if err := os.WriteFile(good, data, 0o644); err != nil {
		t.Fatal(err)
	}
	defer func(was int64) { maxFileSize = was }(maxFileSize)
	maxFileSize = int64(len(data))
	if _, err := Load(good); err != nil {
		t.Fatalf("a tokenizer.json of exactly the cap: %v", err)
	}
	maxFileSize = int64(len(data)) - 1
	wantBadInput(t, "one byte over the cap", func() error { _, err := Load(good); return err }(), good+": is larger than")

	// The cap itself: a sparse file one byte past it takes no disk.
	maxFileSize = 256 << 20
	huge := filepath.Join(dir, "huge.json")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(maxFileSize + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = Load(huge)
	wantBadInput(t, huge, err, huge+": is larger than 256 MiB, the most a tokenizer.json may be", "give the path of a tokenizer.json")

	// Devices and pipes have no size to judge by: the read stops past the
	// cap. A small cap keeps the reads short.
	maxFileSize = 1 << 20
	if _, err := os.Stat("/dev/zero"); err == nil {
		_, err := Load("/dev/zero")
		wantBadInput(t, "/dev/zero", err, "/dev/zero: is larger than 1 MiB")
	}
	fifo := filepath.Join(dir, "endless.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	wrote := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			wrote <- err
			return
		}
		defer w.Close()
		chunk := make([]byte, 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				wrote <- err // the reader closed the pipe: it stopped
				return
			}
		}
	}()
	_, err = Load(fifo)
	wantBadInput(t, fifo, err, fifo+": is larger than 1 MiB")
	if err := <-wrote; !errors.Is(err, syscall.EPIPE) {
		t.Errorf("the writer of the pipe ended with %v; want EPIPE, the reader having stopped", err)
	}

	// A reader (an object's body) has the same cap, read to one byte past.
	endless := &countingZeros{}
	_, err = ReadAll(endless, "object storage tokenizers/x/tokenizer.json")
	wantBadInput(t, "an endless object", err, "object storage tokenizers/x/tokenizer.json: is larger than 1 MiB")
	if endless.n != maxFileSize+1 {
		t.Errorf("read %d bytes of an endless object; want the cap and one more, %d", endless.n, maxFileSize+1)
	}
	if b, err := ReadAll(bytes.NewReader(data[:100]), "small"); err != nil || !bytes.Equal(b, data[:100]) {
		t.Errorf("ReadAll of 100 bytes: %d bytes, %v", len(b), err)
	}
}

// countingZeros is an endless reader of zeros that counts what was read.
type countingZeros struct{ n int64 }

func (z *countingZeros) Read(p []byte) (int, error) {
	clear(p)
	z.n += int64(len(p))
	return len(p), nil
}

// A vocabulary that gives one id to two tokens is refused at load, naming
// the file, the id and both tokens, on the hand-read path and through
// encoding/json alike; so is an added token at an id a token of other
// content has. An added token that repeats a vocabulary entry with its id,
// as HF files do for their special tokens, is accepted.
func TestLoadRefusesTwoTokensWithOneID(t *testing.T) {
	dir := t.TempDir()
	file := func(name, vocab, added string) string {
		p := filepath.Join(dir, name)
		body := `{"added_tokens": [` + added + `], "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
 "model": {"type": "BPE", "vocab": {` + vocab + `}, "merges": ["a b"]}}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shared := file("shared.json", `"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3, "c": 5, "x": 2, "d": 5`, "")
	special := file("special.json", `"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3`, `{"id": 0, "content": "<|endoftext|>", "special": true}`)
	clash := file("clash.json", `"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3`, `{"id": 2, "content": "<dup>", "special": true}`)
	twice := file("twice.json", `"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3`, `{"id": 9, "content": "<x>", "special": true}, {"id": 9, "content": "<y>", "special": true}`)
	defer func(was bool) { fastLoad = was }(fastLoad)
	for _, fast := range []bool{true, false} {
		fastLoad = fast
		_, err := Load(shared)
		// The smallest shared id, and its first two tokens in order, so
		// that the message is the same on every load.
		wantBadInput(t, shared, err, shared+`: model.vocab gives id 2 to two tokens, "b" and "x"`, "give one of them another id")
		// An added token of other content at an id the vocabulary gives,
		// or at another added token's: the id decoded as the added token.
		_, err = Load(clash)
		wantBadInput(t, clash, err, clash+`: added_tokens[0] ("<dup>") has id 2, which model.vocab gives to "b"`, "give the added token an id no other token has")
		_, err = Load(twice)
		wantBadInput(t, twice, err, twice+`: added_tokens[1] ("<y>") has id 9, as added_tokens[0] ("<x>") has`, "give one of them another id")
		tk, err := Load(special)
		if err != nil {
			t.Fatalf("fast %v: an added token repeating its vocabulary entry: %v", fast, err)
		}
		if id, ok := tk.EOS(); !ok || id != 0 {
			t.Errorf("fast %v: EOS = %d, %v; want 0", fast, id, ok)
		}
	}
}
