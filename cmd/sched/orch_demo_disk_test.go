package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// sched demo on a disk with less free than its training keeps free is
// refused before the tokenizer and the ingest, naming --dir and what its
// disk has free, and says what the demo lets one change (the training
// would fail only after them, advising a runs file the demo does not read).
func TestDemoOnADiskWithoutRoomIsRefusedFirst(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testsvc.SmallDisk(t, 20<<20), "demo")
	out, errOut, code := sched(t, nil, "demo", "--dir", dir, "--duration", "5s")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != exitBadInput || len(lines) != 1 || !strings.Contains(errOut, "--dir "+dir+": its disk has ") ||
		!strings.Contains(errOut, "below the 1.0 GiB the demo's training keeps free") || !strings.Contains(errOut, "give --dir a directory on a disk with more room") {
		t.Fatalf("demo on a 20 MB disk: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out, "==> ") {
		t.Errorf("demo on a 20 MB disk began its stages:\n%s", out)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("demo on a 20 MB disk left %v in --dir", left)
	}
}
