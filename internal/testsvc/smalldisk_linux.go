package testsvc

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// SmallDisk is a new directory on a tmpfs of size bytes of its own, a disk
// that fills, unmounted at the end of the test; the test is skipped where
// this process may not mount one (no root, or no CAP_SYS_ADMIN).
func SmallDisk(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("a full disk needs a tmpfs of its own on %s, and mounting one failed: %v", dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}
