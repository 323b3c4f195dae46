package tokenizer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
)

// streamChunk is the size at which EncodeReader looks for a cut. 1 MiB per
// worker keeps memory small and the workers busy.
var streamChunk = 1 << 20

// cuttable reports whether the text can be cut at safe points and encoded
// in pieces with the same ids as a whole: not when a pre-tokenizer adds a
// prefix space (each piece would get one), nor when an added token contains
// a line break (it could straddle a cut).
func (t *Tokenizer) cuttable() bool {
	for _, s := range t.stages {
		if s.prefixSpace {
			return false
		}
	}
	for _, a := range t.added {
		if strings.ContainsAny(a.content, "\r\n") {
			return false
		}
	}
	return true
}

// safeCut returns the last offset p in b at which encoding b[:p] and b[p:]
// separately gives the ids of b, or -1. It cuts after a single "\n" that
// follows a visible ASCII character and precedes an ASCII letter: in both
// the GPT-2 and GPT-4 patterns that line break is a word of its own (or
// ends a punctuation word), the lookahead `(?!\S)` sees the same thing at
// the end of a piece as before the letter, and matching restarts at the
// letter whatever came before.
func safeCut(b []byte) int {
	for end := len(b); ; {
		j := bytes.LastIndexByte(b[:end], '\n')
		if j < 1 {
			return -1
		}
		if p := j + 1; p < len(b) {
			c, prev := b[p]|0x20, b[j-1]
			if c >= 'a' && c <= 'z' && prev > ' ' && prev < 0x7f {
				return p
			}
		}
		end = j
	}
}

// EncodeReader encodes a text stream on all cores with the ids Encode would
// give for the whole text, calling emit with consecutive runs of ids in
// order. Memory stays bounded by a few MiB per core unless the text has no
// safe cut point for long stretches (a huge line).
func (t *Tokenizer) EncodeReader(ctx context.Context, r io.Reader, emit func(ids []uint32) error) error {
	workers := runtime.GOMAXPROCS(0)
	cut := t.cuttable()
	var pending []byte
	eof := false
	buf := make([]byte, streamChunk)
	for !eof {
		// Gather up to one chunk per worker.
		var chunks [][]byte
		need := streamChunk
		for len(chunks) < workers && !eof {
			for len(pending) < need && !eof {
				n, err := r.Read(buf)
				pending = append(pending, buf[:n]...)
				if errors.Is(err, io.EOF) {
					eof = true
				} else if err != nil {
					return fmt.Errorf("encode: read: %w", err)
				}
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			p := -1
			if cut && !eof {
				p = safeCut(pending)
			}
			if p <= 0 {
				if !eof {
					need = len(pending) + streamChunk // no safe cut yet: read more
					continue
				}
				p = len(pending)
			}
			chunks = append(chunks, pending[:p:p])
			pending = append([]byte(nil), pending[p:]...)
			need = streamChunk
		}
		out := make([][]uint32, len(chunks))
		var wg sync.WaitGroup
		for i := range chunks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out[i] = t.AppendEncoded(nil, chunks[i])
			}()
		}
		wg.Wait()
		for _, ids := range out {
			if err := emit(ids); err != nil {
				return err
			}
		}
	}
	return nil
}
