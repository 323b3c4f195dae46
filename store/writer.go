package store

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Writer is an object whose bytes go to the store as they are written. The
// object exists only once Close returns nil: until then a reader sees the
// old object or none, and after Abort, or a Close that fails, it never
// appears.
type Writer interface {
	io.Writer
	// Close completes the object.
	Close() error
	// Abort drops the object; cause says why (the writer's caller failed).
	// It returns the error that had already stopped the upload, the one
	// Write returned, if there was one, and otherwise whatever kept the
	// store from dropping what it had received.
	Abort(cause error) error
}

// NewUnsignedWriter starts an object at key for bytes that whoever reads
// them verifies on its own, as PutUnsigned does. A store that can stream
// an object itself (S3) fills reused part buffers straight from Write; any
// other store gets the bytes through a pipe into its Put. Nothing is sent
// before the first Write.
func NewUnsignedWriter(ctx context.Context, s Store, key string) Writer {
	if w, ok := s.(interface {
		unsignedWriter(ctx context.Context, key string) Writer
	}); ok {
		return w.unsignedWriter(ctx, key)
	}
	return &pipeWriter{ctx: ctx, s: s, key: key}
}

// pipeWriter streams into any store's Put, of unknown size, through a pipe.
type pipeWriter struct {
	ctx    context.Context
	s      Store
	key    string
	pw     *io.PipeWriter
	done   chan error
	failed bool // a Write returned the put's error
}

// start begins the put, at the first Write or at Close.
func (w *pipeWriter) start() {
	pr, pw := io.Pipe()
	w.pw, w.done = pw, make(chan error, 1)
	go func() {
		err := PutUnsigned(w.ctx, w.s, w.key, pr, -1)
		// A put that gave up must not leave the writer blocked: its next
		// write returns the put's error.
		pr.CloseWithError(err)
		w.done <- err
	}()
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	if w.pw == nil {
		w.start()
	}
	n, err := w.pw.Write(b)
	if err != nil {
		w.failed = true
	}
	return n, err
}

func (w *pipeWriter) Close() error {
	if w.pw == nil {
		w.start()
	}
	w.pw.Close()
	return <-w.done
}

func (w *pipeWriter) Abort(cause error) error {
	if w.pw == nil {
		return nil
	}
	if cause == nil {
		cause = errors.New("aborted")
	}
	w.pw.CloseWithError(fmt.Errorf("object not written whole: %w", cause))
	err := <-w.done
	if !w.failed {
		// The put failed because of the abort: its error is the cause's
		// echo, and the store's Put leaves nothing behind.
		return nil
	}
	return err
}
