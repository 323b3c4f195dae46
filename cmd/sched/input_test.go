package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hangBound is how long a stopped command is given to end before the test
// calls it hung: the stop itself takes microseconds, so this is no margin
// a busy machine could use up, only what keeps a hang from holding the
// whole package until its timeout.
const hangBound = 2 * time.Minute

// stopAt starts cmd, sends it sig once its standard error has shown a
// line holding at ("" for at once: the caller knows it is ready), and
// returns its exit code and all its standard error, failing t where it
// does not end after the signal.
func stopAt(t *testing.T, cmd *exec.Cmd, at string, sig syscall.Signal, ready func()) (int, string) {
	t.Helper()
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var said strings.Builder
	lines := bufio.NewScanner(pipe)
	for at != "" && lines.Scan() {
		said.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), at) {
			break
		}
	}
	if ready != nil {
		ready()
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	rest := make(chan string, 1)
	go func() {
		var b strings.Builder
		for lines.Scan() {
			b.WriteString(lines.Text() + "\n")
		}
		rest <- b.String()
	}()
	select {
	case r := <-rest:
		said.WriteString(r)
	case <-time.After(hangBound):
		_ = cmd.Process.Kill()
		said.WriteString(<-rest)
		_ = cmd.Wait()
		t.Fatalf("sched %v did not end after the signal: it hangs until killed\n%s", cmd.Args[1:], said.String())
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), said.String()
}

// sched tokenize and sched tokenizer train reading a stream that nothing
// writes to (a pipe, a FIFO) stop at Ctrl-C or SIGTERM, say that nothing
// was written to --out (a file there keeps its bytes) and exit 130, where
// they went on waiting for input and only SIGKILL ended them.
func TestATextCommandWaitingOnItsInputStopsAtASignal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := goldenTokenizer(t, dir)

	t.Run("tokenize from a pipe", func(t *testing.T) {
		out := filepath.Join(dir, "ids.bin")
		before := []byte("the ids of an earlier run")
		if err := os.WriteFile(out, before, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "tokenize", "--tokenizer-file", tok, "--in", "/dev/stdin", "--out", out, "--force")
		cmd.Env = baseEnv(t)
		w, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		code, said := stopAt(t, cmd, "", syscall.SIGINT, func() {
			// Sixteen times what a pipe buffers: the write ends once
			// the command has read most of it, so it is reading (its
			// signal handling in place) when the signal comes, and then
			// waits for more.
			text := bytes.Repeat([]byte("func main() { println(\"hello\") }\n"), 1<<20/34)
			if _, err := w.Write(text); err != nil {
				t.Fatalf("writing the text to tokenize's standard input: %v", err)
			}
		})
		want := "nothing was written to " + out + " (a file already there is as it was)"
		if code != exitInterrupted || !strings.Contains(said, "tokenize stopped (") || !strings.Contains(said, want) {
			t.Fatalf("exit %d\n%swant exit %d and a line saying tokenize stopped and %q", code, said, exitInterrupted, want)
		}
		if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, before) {
			t.Fatalf("--out after the stop holds %q (%v); want the earlier file's bytes", b, err)
		}
	})

	t.Run("tokenizer train from a FIFO", func(t *testing.T) {
		fifo := filepath.Join(dir, "corpus")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "trained.json")
		cmd := exec.Command(os.Args[0], "tokenizer", "train", "--in", fifo, "--vocab", "300", "--out", out)
		cmd.Env = baseEnv(t)
		code, said := stopAt(t, cmd, "", syscall.SIGTERM, func() {
			// Opened for writing once the command has opened it for
			// reading; then nothing is written.
			w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close() })
		})
		if code != exitInterrupted || !strings.Contains(said, "tokenizer train stopped (terminated signal received)") || !strings.Contains(said, "nothing was written to "+out) {
			t.Fatalf("exit %d\n%swant exit %d and a line saying tokenizer train stopped and wrote nothing", code, said, exitInterrupted)
		}
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("--out after the stop: %v; want no file", err)
		}
	})
}

// A FIFO that nothing opens for writing holds its reader's open: the
// input's opening ends when the command's context does.
func TestOpenInputEndsWithTheContext(t *testing.T) {
	t.Parallel()
	fifo := filepath.Join(t.TempDir(), "corpus")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("interrupt signal received")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	opened := make(chan error, 1)
	go func() {
		f, err := openInput(ctx, fifo)
		if f != nil {
			f.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		if !errors.Is(err, cause) {
			t.Fatalf("openInput of a FIFO no one writes, its context ended: %v; want the context's cause", err)
		}
	case <-time.After(hangBound):
		t.Fatal("openInput of a FIFO no one writes waits on after its context ended")
	}
	// The open still waiting ends, its file closed, once a writer comes.
	if w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
		w.Close()
	}
}

// A command that a signal stops and that says no more than that its
// context ended (sched bench here) names itself and the signal and exits
// 130, where it said "context canceled" and exited 1.
func TestACommandStoppedByASignalSaysSoAndExits130(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "bench", "--engine", "cpu", "--model", "tiny", "--batch", "1", "--seq", "64", "--steps", "1000000")
	cmd.Env = baseEnv(t)
	// Said as the measuring starts.
	code, said := stopAt(t, cmd, "computes in fp32 only", syscall.SIGINT, nil)
	if want := "sched: bench stopped (interrupt signal received) before it finished\n"; code != exitInterrupted || !strings.HasSuffix(said, want) {
		t.Fatalf("exit %d\n%swant exit %d and the last line %q", code, said, exitInterrupted, want)
	}
}

// A second signal ends a command at once, where the first waits for the
// command to stop where it keeps its work whole: here tokenize writing its
// ids to a pipe that nothing reads, which no stop of its own could end.
func TestASecondSignalStopsACommandAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := goldenTokenizer(t, dir)
	in := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(in, bytes.Repeat([]byte("func main() { println(\"hello\") }\n"), 1<<17), 0o644); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// One page: the command's writes of its ids, far larger, wait.
	if _, err := unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, 4096); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "tokenize", "--tokenizer-file", tok, "--in", in, "--out", "/dev/stdout")
	cmd.Env = baseEnv(t)
	cmd.Stdout = w
	var said bytes.Buffer
	cmd.Stderr = &said
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The pipe full: the command waits in a write that only a reader
	// would end.
	for full := false; !full; {
		select {
		case err := <-exited:
			t.Fatalf("tokenize ended before its output filled the pipe: %v\n%s", err, said.String())
		case <-time.After(10 * time.Millisecond):
		}
		n, err := unix.IoctlGetInt(int(r.Fd()), unix.TIOCINQ)
		if err != nil {
			t.Fatal(err)
		}
		full = n >= 4096
	}
	// SIGTERM, which no shell sets aside as it may SIGINT; sent again
	// until the process ends, since the first one's handling is not seen
	// from outside.
	bound := time.After(hangBound)
	for {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(50 * time.Millisecond):
			continue
		case <-bound:
			go io.Copy(io.Discard, r)
			<-exited
			t.Fatalf("tokenize blocked on its output went on after SIGTERM sent again and again\n%s", said.String())
		}
		break
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("tokenize after a second SIGTERM: %v\n%swant it ended by the signal", cmd.ProcessState, said.String())
	}
}

// A gpu task's process, which its worker stops and which systemd's stop
// signals too (every process of the unit), is not ended by a second
// SIGTERM: that would lose the checkpoint its stop is writing. Every other
// command is.
func TestASecondSignalEndsEveryCommandButAGPUTasksProcess(t *testing.T) {
	for _, c := range []struct {
		args []string
		ends bool
	}{
		{[]string{taskCommand}, false},
		{[]string{"worker", "--queues", "gpu=1"}, true},
		{[]string{"train", "--steps", "2"}, true},
		{[]string{"tokenize"}, true},
		{nil, true},
	} {
		if got := secondSignalEnds(c.args); got != c.ends {
			t.Errorf("sched %v: a second signal ends it: %v, want %v", c.args, got, c.ends)
		}
	}
}
