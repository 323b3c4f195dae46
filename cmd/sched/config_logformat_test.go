//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// KILN_LOG_FORMAT: json writes JSON lines and console readable ones
// wherever the log goes; auto, the default, writes console lines on a
// terminal and JSON into a pipe or a file (a container's log, CI).
func TestLogFormatIsConsoleOnATerminalAndJSONElsewhere(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		format   string
		terminal bool
		json     bool
	}{
		{"json", false, true},
		{"json", true, true},
		{"console", false, false},
		{"console", true, false},
		{"auto", false, true},
		{"auto", true, false},
	} {
		line := logLine(t, c.format, c.terminal)
		if isJSON := json.Valid([]byte(line)); isJSON != c.json || !strings.Contains(line, "segment checkpointed") {
			t.Errorf("KILN_LOG_FORMAT=%s, on a terminal %v: the log line is %q; want JSON %v", c.format, c.terminal, line, c.json)
		}
	}
}

// logLine is the line a logger of format writes, to a terminal or to a
// pipe.
func logLine(t *testing.T, format string, terminal bool) string {
	t.Helper()
	r, w := openPipe(t)
	if terminal {
		r, w = openTerminal(t)
	}
	newLogger(w, format).Info("segment checkpointed")
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(line, "\r\n")
}

func openPipe(t *testing.T) (r, w *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// openTerminal opens a pseudo-terminal: w is its terminal side, r the side
// that reads what is written there.
func openTerminal(t *testing.T) (r, w *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// KILN_LOG_FORMAT=console colours the level on a terminal only: chosen for
// a file (sched worker > worker.log) or a pipe, its lines hold no escape
// codes, where they held the terminal's colour codes wherever they went.
func TestConsoleLogColoursOnlyOnATerminal(t *testing.T) {
	t.Parallel()
	if line := logLine(t, "console", true); !strings.Contains(line, "\x1b[") || !strings.Contains(line, "INFO") {
		t.Errorf("console log on a terminal: %q; want its level coloured", line)
	}
	if line := logLine(t, "console", false); strings.Contains(line, "\x1b") || !strings.Contains(line, "\tINFO\t") {
		t.Errorf("console log into a pipe: %q; want the level as plain INFO, no escape codes", line)
	}

	// The command's own log, into a pipe, as sched ingest writes it.
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a.go"), []byte("package main\nfunc f() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := sched(t, []string{"KILN_LOG_FORMAT=console"}, "ingest", "local:"+filepath.Join(src, "*.go"), "--direct",
		"--store-dir", filepath.Join(dir, "store"), "--tokenizer-file", goldenTokenizerWithEOS(t, dir))
	if code != 0 || !strings.Contains(errOut, "\tINFO\t") || strings.Contains(errOut, "\x1b") {
		t.Fatalf("sched ingest with KILN_LOG_FORMAT=console, its log into a pipe: exit %d\n%q\nwant exit 0 and INFO lines with no escape codes", code, errOut)
	}
}
