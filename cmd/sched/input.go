package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// openInput opens a text input of a command that works here and now
// (tokenize's --in, tokenizer train's). A stream (a pipe, a FIFO, a
// terminal) may hold the command for as long as nothing writes to it, a
// FIFO already at its opening: a signal stops the command there too, as
// it does while a file is read. The file's close, once ctx ends, is what
// ends a read waiting on a stream.
func openInput(ctx context.Context, path string) (*os.File, error) {
	type opened struct {
		f   *os.File
		err error
	}
	done := make(chan opened, 1)
	go func() {
		f, err := os.Open(path)
		done <- opened{f, err}
	}()
	var o opened
	select {
	case o = <-done:
	case <-ctx.Done():
		// The open of a FIFO with no writer goes on waiting; the file,
		// should one come, is closed, and the process ends anyway.
		go func() {
			if o := <-done; o.f != nil {
				o.f.Close()
			}
		}()
		return nil, context.Cause(ctx)
	}
	if o.err != nil {
		return nil, o.err
	}
	if st, err := o.f.Stat(); err == nil && !st.Mode().IsRegular() {
		context.AfterFunc(ctx, func() { o.f.Close() })
	}
	return o.f, nil
}

// stoppedBy is err, the error of a text command (tokenize, tokenizer
// train), where no signal stopped it; where one did (ctx ended), whatever
// the work returned, it says so and what became of out, and exits 130.
func stoppedBy(ctx context.Context, what, out string, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if !errors.Is(err, context.Cause(ctx)) {
		// The closed stream's error, an open given up: the signal is why.
		err = context.Cause(ctx)
	}
	kept := fmt.Sprintf("nothing was written to %s (a file already there is as it was)", out)
	if st, serr := os.Stat(out); serr == nil && !st.Mode().IsRegular() || isDescriptor(out) {
		kept = fmt.Sprintf("%s has what was written before the stop, which is not the whole", out)
	}
	return interruptedError{fmt.Errorf("%s stopped (%w) before it finished: %s; the same command again does the whole", what, err, kept)}
}

// isDescriptor reports whether out names a descriptor of this process
// (/dev/stdout, /dev/fd/N), which is written in place.
func isDescriptor(out string) bool {
	_, ok := descriptorOf(out)
	return ok
}
