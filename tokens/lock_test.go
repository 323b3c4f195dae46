package tokens

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

// A store lock released while a child of this process still shares its
// open file (forked, not yet exec'd) is taken again once the child lets it
// go, not refused as held by another appender; one this process's own
// appender holds is refused.
func TestALockAChildStillSharesIsTakenOnceItLetsGo(t *testing.T) {
	dir := t.TempDir()
	l, err := lockStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	var locked *LockedError
	if _, err := lockStore(dir); !errors.As(err, &locked) || locked.PID != os.Getpid() {
		t.Fatalf("a second lock of a store this process holds: %v, want it refused naming this process", err)
	}
	// The child holds the lock's open file as a forked child does until
	// its exec: here until its stdin closes.
	child := exec.Command("sh", "-c", "cat > /dev/null")
	child.ExtraFiles = []*os.File{l.f}
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	if err := l.release(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := lockStore(dir)
		if err == nil {
			err = l2.release()
		}
		got <- err
	}()
	stdin.Close()
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the lock once this process's child let it go: %v", err)
	}

}
