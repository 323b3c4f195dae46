package main

import (
	"regexp"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// Cancelling a task that has already ended (cancelled before, failed for
// good, completed) does nothing and says so, exit 0: the task does not
// run, as asked, and a task that ends a moment before its cancel arrives
// was answered exit 2 as bad input, where one that ends while the cancel
// waits is answered exit 0.
func TestCancelOfATaskThatEndedSaysSoAndSucceeds(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	out, errOut, code := sched(t, env, "enqueue", "tokenizer", "mix-16384")
	id := regexp.MustCompile(`tokenizer:sample:[0-9a-f]+`).FindString(out)
	if code != 0 || id == "" {
		t.Fatalf("enqueue tokenizer: exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "cancel", id); code != 0 || out != id+" cancelled: archived while it waited to run; it will not run\n" {
		t.Fatalf("cancel %s: exit %d %q %q; want it said archived as it waited, not stopped, which it never began", id, code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "cancel", id); code != 0 || out != "task "+id+" is already archived; nothing to cancel\n" || errOut != "" {
		t.Fatalf("cancel %s again: exit %d %q %q; want exit 0 and it said to be archived already", id, code, out, errOut)
	}
	// Queued again, it says it had been cancelled, not the cancellation's
	// echo as an error.
	if out, errOut, code := sched(t, env, "retry", id); code != 0 || out != "queued "+id+" on ingest again (it had been cancelled by sched cancel)\n" {
		t.Fatalf("retry %s after its cancel: exit %d %q %q", id, code, out, errOut)
	}
}
