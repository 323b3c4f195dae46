package main

import (
	"bytes"
	"fmt"
	"io"
)

// Text holds no NUL byte: UTF-8 writes a zero byte for the character NUL
// alone, which no text file has, where binary data is full of them. So
// the --in of tokenize and tokenizer train is read as text up to its
// first NUL byte, which ends the command (exit 2) naming the input. A
// device such as /dev/zero was read for ever, without a word: one endless
// line of NULs, which training counted a chunk at a time, and which
// tokenize held whole, waiting for a line break to cut it at, until memory
// ran out (1.9 GB resident after 3 s on a 2-vCPU VM). /dev/urandom (a NUL
// every 256 bytes or so), a disk, an image, an archive and text in UTF-16
// (a zero byte in every ASCII character) are refused alike, where they
// taught a vocabulary of binary data or were encoded to ids of it. A
// stream of text (a pipe, a FIFO, /dev/stdin) is read to its end, however
// long, as before.

// binaryInputError is a NUL byte read from an --in of tokenize or
// tokenizer train.
type binaryInputError struct {
	Command string // "tokenize", "tokenizer train"
	Path    string // as --in names it
	// Offset is a NUL byte's offset in the input: the first one's, where
	// the input is read in order (a stream, or training's files).
	Offset int64
}

func (e *binaryInputError) Error() string {
	name := "a file" // tokenize's one
	if e.Command == "tokenizer train" {
		name = "files"
	}
	return fmt.Sprintf("%s: --in %s has a NUL byte at byte %d, which no text has: it is binary data (a device such as /dev/zero or /dev/urandom, a disk, an image, an archive) or text in UTF-16, not UTF-8 text; name %s of UTF-8 text (iconv -f UTF-16 -t UTF-8 converts UTF-16)",
		e.Command, e.Path, e.Offset, name)
}

func (e *binaryInputError) BadInput() bool { return true }

// textStream reads an --in from r, read in order, as text: the read that
// meets a NUL byte returns the bytes before it and a *binaryInputError.
type textStream struct {
	r   io.Reader
	bin binaryInputError // Command and Path; Offset is set where a NUL is met
	off int64            // the offset in the input of the next byte Read reads
}

func newTextStream(command, path string, r io.Reader) *textStream {
	return &textStream{r: r, bin: binaryInputError{Command: command, Path: path}}
}

func (t *textStream) Read(b []byte) (int, error) {
	n, err := t.r.Read(b)
	if i := bytes.IndexByte(b[:n], 0); i >= 0 {
		return i, t.nul(t.off + int64(i))
	}
	t.off += int64(n)
	return n, err
}

// nul is the error of a NUL byte at off.
func (t *textStream) nul(off int64) error {
	e := t.bin
	e.Offset = off
	return &e
}

// textFile is textStream for a regular file that tokenize's workers read
// at offsets, each its own piece (tokenizer.EncodeReader): it keeps the
// file's ReadAt and Seek, and every ReadAt is looked through as Read is.
// It is never made of a device or a pipe: given a ReadAt and a Seek that
// work, /dev/zero would be read at offsets as a file of no bytes.
type textFile struct {
	*textStream
	at   io.ReaderAt
	seek io.Seeker
}

// fileText is a regular file's reader: an *os.File, or progressFile.
type fileText interface {
	io.Reader
	io.ReaderAt
	io.Seeker
}

func newTextFile(command, path string, f fileText) *textFile {
	return &textFile{textStream: newTextStream(command, path, f), at: f, seek: f}
}

func (t *textFile) ReadAt(b []byte, off int64) (int, error) {
	n, err := t.at.ReadAt(b, off)
	if i := bytes.IndexByte(b[:n], 0); i >= 0 {
		return i, t.nul(off + int64(i))
	}
	return n, err
}

func (t *textFile) Seek(offset int64, whence int) (int64, error) {
	p, err := t.seek.Seek(offset, whence)
	if err == nil {
		t.off = p // Read goes on from there
	}
	return p, err
}
