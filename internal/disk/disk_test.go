package disk

import (
	"path/filepath"
	"strings"
	"testing"
)

// Free reads a directory's filesystem, and names a directory that is not
// there.
func TestFree(t *testing.T) {
	if n, err := Free(t.TempDir()); err != nil || n <= 0 {
		t.Fatalf("free space of a temporary directory: %d, %v", n, err)
	}
	missing := filepath.Join(t.TempDir(), "gone")
	if _, err := Free(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("free space of a missing directory: %v", err)
	}
}
