package testsvc

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Child is the test binary run again for one helper test, which prints
// one line on stdout once it holds what the test wants held, then waits
// for its stdin to close (as it does when the test dies): a process the
// test can kill with SIGKILL at a known point.
type Child struct {
	Cmd *exec.Cmd
	// Line is the helper's ready line, without its newline.
	Line   string
	stdin  io.WriteCloser
	stderr bytes.Buffer
}

// StartChild runs the helper test named helper with env added, and returns
// once it says it is ready.
func StartChild(t testing.TB, helper string, env ...string) *Child {
	t.Helper()
	c := &Child{Cmd: exec.Command(os.Args[0], "-test.run=^"+helper+"$")}
	c.Cmd.Env = append(os.Environ(), env...)
	c.Cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.Cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.Cmd.ProcessState == nil {
			c.Kill(t)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		c.Kill(t)
		t.Fatalf("%s did not say it was ready: %q, %v; stderr:\n%s", helper, line, err, c.stderr.String())
	}
	c.Line = strings.TrimSuffix(line, "\n")
	return c
}

// Kill ends the helper with SIGKILL, as the OOM killer would, and returns
// once it is reaped: the kernel has dropped its flocks by then.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := c.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.Cmd.Wait()
}

// Release closes the helper's stdin and waits for it to exit, which must
// be a success.
func (c *Child) Release(t testing.TB) {
	t.Helper()
	c.stdin.Close()
	if err := c.Cmd.Wait(); err != nil {
		t.Fatalf("helper: %v; stderr:\n%s", err, c.stderr.String())
	}
}
