//go:build linux

package tokens

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing bytes [off, off+n) of f
// to disk, without waiting for them, so that a shard's pages go to disk
// while the rest of it is still being read and the fsync that commits it
// waits for the tail only. It is a hint: an error changes nothing, since
// the commit's fsync is what makes the bytes durable, and it still runs.
func startWriteback(f *os.File, off, n int64) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		_ = unix.SyncFileRange(int(fd), off, n, unix.SYNC_FILE_RANGE_WRITE)
	})
}
