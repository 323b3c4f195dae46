package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// `sched status --watch` on a terminal narrower or shorter than its frame
// (status lines are 100 to 230 characters wide) wrapped every long line,
// and each refresh scrolled the terminal: the header and the queues were
// never on the screen, and the scrollback filled with a copy of the frame
// a refresh. Each line is cut to the terminal's width, and a frame of more
// lines than it has rows ends, on its last row, saying how many lines are
// left out and how to see them: one frame, redrawn in place.
func TestStatusWatchFitsAFrameToASmallTerminal(t *testing.T) {
	t.Parallel()
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed: no terminal to watch on")
	}
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0)}
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	run := func(args ...string) string {
		b, err := exec.Command(tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v: %s", args, err, b)
		}
		return string(b)
	}
	const cols, rows = 60, 12
	cmdline := "env -i " + shellQuote(append(baseEnv(t), env...)...) + " " + shellQuote(os.Args[0], "status", "--watch", "--interval", "300ms")
	run("new-session", "-d", "-x", "60", "-y", "12", "-s", "watch", cmdline+"; sleep 60")
	t.Cleanup(func() { exec.Command(tmux, "-S", sock, "kill-server").Run() })

	// Two frames drawn: the time in the header has changed.
	header := regexp.MustCompile(`kiln status at (\S+ \S+)`)
	var first, all string
	deadline := time.Now().Add(time.Minute)
	for {
		// The screen with all that scrolled off it above.
		all = run("capture-pane", "-p", "-S", "-", "-t", "watch")
		if m := header.FindAllStringSubmatch(all, -1); len(m) > 0 {
			if first == "" {
				first = m[0][1]
			} else if m[len(m)-1][1] != first {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("status --watch never drew a second frame:\n%s", all)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := strings.Count(all, "kiln status at "); n != 1 {
		t.Fatalf("status --watch on a %dx%d terminal scrolled: %d frames' headers on the screen and above it:\n%s", cols, rows, n, all)
	}
	// The screen between two redraws: the frame's first line on the top
	// row, and on the last the lines left out.
	last := regexp.MustCompile(`^\(\d+ more lines: make the terminal taller, or drop --watch\)$`)
	var screen []string
	for {
		screen = strings.Split(strings.TrimRight(run("capture-pane", "-p", "-t", "watch"), "\n"), "\n")
		if len(screen) == rows && strings.HasPrefix(screen[0], "kiln status at ") && last.MatchString(screen[rows-1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want the frame's first line on the first row, and on the last (row %d) how many lines are left out; got:\n%s", rows, strings.Join(screen, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{"QUEUE ", "WORKERS"} {
		if !strings.Contains(strings.Join(screen, "\n"), "\n"+want) {
			t.Errorf("the screen lacks the %s section:\n%s", want, strings.Join(screen, "\n"))
		}
	}
	// The worker line, 85 characters, cut at the edge, its end marked.
	cut := "no worker is running (start one with 'sched worker --queues…"
	if utf8.RuneCountInString(cut) != cols || !strings.Contains(strings.Join(screen, "\n"), "\n"+cut+"\n") {
		t.Errorf("the worker line is not cut at %d columns as %q:\n%s", cols, cut, strings.Join(screen, "\n"))
	}
}

// A frame fits cols x rows: each line cut to cols, its end marked, and,
// where there are more lines than rows, rows-1 of them and one that says
// how many more there are; the last ends without a newline, which would
// scroll the bottom row. A terminal of unknown size gets every line
// whole.
func TestAFrameDrawnInPlaceFitsTheTerminal(t *testing.T) {
	var frame strings.Builder
	frame.WriteString("kiln status at 2026-12-07 19:18:08, every 1s (ctrl-c to stop)\n\n")
	for i := 0; i < 10; i++ {
		frame.WriteString(strings.Repeat("x", 30+i) + "\n")
	}
	got := inPlace(frame.String(), 32, 6)
	body, ok := strings.CutPrefix(got, escHome)
	body, ok2 := strings.CutSuffix(body, escClearBelow)
	if !ok || !ok2 {
		t.Fatalf("frame %q: want it drawn from home and everything below cleared", got)
	}
	want := []string{"kiln status at 2026-12-07 19:18…", "", strings.Repeat("x", 30), strings.Repeat("x", 31), strings.Repeat("x", 32),
		"(7 more lines: make the termina…"}
	lines := strings.Split(body, "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d rows, want %d: %q", len(lines), len(want), body)
	}
	for i, l := range lines {
		if l != escClearLine+want[i] {
			t.Errorf("row %d: %q, want %q", i, l, escClearLine+want[i])
		}
	}
	whole := inPlace(frame.String(), 0, 0)
	if strings.Count(whole, "\n") != 11 || !strings.Contains(whole, escClearLine+strings.Repeat("x", 39)+escClearBelow) {
		t.Errorf("a terminal of unknown size: %q; want all 12 lines whole", whole)
	}
}
