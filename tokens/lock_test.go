package tokens

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A store lock released while a child of this process still shares its
// open file (forked, not yet exec'd) is taken again once the child lets it
// go, not refused as held by another appender; one this process's own
// appender holds is refused.
func TestALockAChildStillSharesIsTakenOnceItLetsGo(t *testing.T) {
	dir := t.TempDir()
	l, err := lockStore(context.Background(), dir, LockWait{})
	if err != nil {
		t.Fatal(err)
	}
	var locked *LockedError
	if _, err := lockStore(context.Background(), dir, LockWait{}); !errors.As(err, &locked) || locked.PID != os.Getpid() {
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
		l2, err := lockStore(context.Background(), dir, LockWait{})
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

// otherHolder makes a child process the holder of dir's store lock, as
// another appender would be, and returns its pid and the function that
// ends it, which lets the store go.
func otherHolder(t *testing.T, dir string) (pid int, release func()) {
	t.Helper()
	l, err := lockStore(context.Background(), dir, LockWait{})
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sh", "-c", "cat > /dev/null")
	child.ExtraFiles = []*os.File{l.f}
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	pid = child.Process.Pid
	// The child's open file is the lock's now, and the file names it.
	if err := l.f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.f.WriteAt([]byte(strconv.Itoa(pid)+"\n"), 0); err != nil {
		t.Fatal(err)
	}
	if err := l.release(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			stdin.Close()
			if err := child.Wait(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return pid, release
}

// An appender that may wait for a store another process holds says so,
// naming the holder's pid, and takes the store once the holder lets it
// go; past its wait it is refused with the holder and the wait named; its
// context ends the wait. One that may not wait is refused at once, as
// before.
func TestAnAppenderWaitsForAStoreAnotherProcessHolds(t *testing.T) {
	dir := t.TempDir()
	openTestAppender(t, dir, testTok).Close()
	ctx := context.Background()

	pid, release := otherHolder(t, dir)
	var locked *LockedError
	if _, err := OpenAppender(ctx, dir, testTok, nil); !errors.As(err, &locked) || locked.PID != pid || locked.Waited != 0 ||
		!strings.Contains(err.Error(), "wait for it to finish or stop it") {
		t.Fatalf("an appender that may not wait: %v; want it refused at once, naming pid %d", err, pid)
	}
	heard := make(chan int, 8)
	got := make(chan error, 1)
	go func() {
		a, err := OpenAppenderWaiting(ctx, dir, testTok, nil, LockWait{For: time.Hour, Waiting: func(pid int) { heard <- pid }})
		if err == nil {
			err = a.Close()
		}
		got <- err
	}()
	if p := <-heard; p != pid {
		t.Fatalf("the appender said it waits for pid %d; the holder is %d", p, pid)
	}
	select {
	case err := <-got:
		t.Fatalf("the appender did not wait for the holder: %v", err)
	default:
	}
	release()
	if err := <-got; err != nil {
		t.Fatalf("the appender once the holder let the store go: %v", err)
	}

	// Past its wait, while the holder keeps the store.
	pid, release = otherHolder(t, dir)
	_, err := OpenAppenderWaiting(ctx, dir, testTok, nil, LockWait{For: time.Millisecond})
	if !errors.As(err, &locked) || locked.PID != pid || locked.Waited != time.Millisecond ||
		!strings.Contains(err.Error(), "still locked by pid "+strconv.Itoa(pid)) || !strings.Contains(err.Error(), "sched ingest --direct") {
		t.Fatalf("an appender past its wait: %v; want it refused naming pid %d and its wait", err, pid)
	}
	// Its context ends the wait.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := OpenAppenderWaiting(cctx, dir, testTok, nil, LockWait{For: time.Hour, Waiting: func(int) { cancel() }})
		got <- err
	}()
	if err := <-got; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) {
		t.Fatalf("a wait whose context ended: %v; want context.Canceled, naming the holder", err)
	}
	release()
	a, err := OpenAppender(ctx, dir, testTok, nil)
	if err != nil {
		t.Fatalf("the store once its holder ended: %v", err)
	}
	a.Close()
}
