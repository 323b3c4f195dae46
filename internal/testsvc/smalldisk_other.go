//go:build !linux

package testsvc

import "testing"

// SmallDisk mounts a tmpfs, which these tests do on Linux only: elsewhere
// it skips the test.
func SmallDisk(t testing.TB, size int64) string {
	t.Skip("a full disk (a tmpfs of its own) is exercised on linux")
	return ""
}
