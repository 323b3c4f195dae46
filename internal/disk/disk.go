// Package disk answers how much room a directory's filesystem has left.
package disk

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Free is what the filesystem of dir has free for this user, in bytes.
func Free(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
