package pidlock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// A second Lock of a held file is refused naming the holder's pid; once
// the holder's file is closed the lock is free again, and its file names
// the new holder.
func TestASecondLockNamesTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	first, err := Lock(path, false)
	if err != nil {
		t.Fatal(err)
	}
	var busy *BusyError
	if _, err := Lock(path, false); !errors.As(err, &busy) || busy.PID != os.Getpid() {
		t.Fatalf("the second lock: %v; want it busy, held by pid %d", err, os.Getpid())
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := Lock(path, false)
	if err != nil {
		t.Fatalf("the lock once free: %v", err)
	}
	defer again.Close()
	if Holder(path) != os.Getpid() {
		t.Fatalf("the file names pid %d, want %d", Holder(path), os.Getpid())
	}
}
