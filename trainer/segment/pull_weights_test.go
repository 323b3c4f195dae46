package segment

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/trainer"
)

// inode is the inode number of path, which says whether a directory is
// the one that was there or another renamed over it.
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// sched generate --run pulls what sampling reads, without the optimizer's
// moments; takes a whole copy already there as it is; removes the older
// copy once a newer checkpoint is pulled; and processes pulling at once
// all end with the one whole copy.
func TestPullNewestWeights(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	for _, step := range []int{100, 200} {
		if _, err := Push(ctx, obj, nil, "w", writeTestCheckpoint(t, t.TempDir(), step)); err != nil {
			t.Fatal(err)
		}
	}
	root := t.TempDir()
	none := func(step int, err error) { t.Errorf("step %d passed over as damaged: %v", step, err) }

	const at = 4
	dirs, errs := make([]string, at), make([]error, at)
	var wg sync.WaitGroup
	for i := range at {
		wg.Go(func() { dirs[i], _, errs[i] = PullNewestWeights(ctx, obj, "w", root, none) })
	}
	wg.Wait()
	want := filepath.Join(root, "step-0000200")
	for i := range at {
		if errs[i] != nil || dirs[i] != want {
			t.Fatalf("pull %d of %d at once: %q, %v; want %s", i+1, at, dirs[i], errs[i], want)
		}
	}
	if _, err := trainer.VerifyWeights(want); err != nil {
		t.Fatalf("the pulled copy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(want, trainer.OptimizerFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pulled copy holds %s (%v); sampling never reads it", trainer.OptimizerFile, err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 1 {
		t.Fatalf("the pulls left %v; want the one step directory", entries)
	}

	// Taken as it is: the same directory, though object storage has lost
	// its weights since.
	was := inode(t, want)
	if err := obj.Delete(ctx, checkpointKey("w", 200)+trainer.ModelFile); err != nil {
		t.Fatal(err)
	}
	if dir, step, err := PullNewestWeights(ctx, obj, "w", root, none); err != nil || dir != want || step != 200 || inode(t, want) != was {
		t.Fatalf("pull again: %q step %d, %v; want the copy there taken as it is", dir, step, err)
	}

	// A newer checkpoint: pulled, and the older copy removed.
	if _, err := Push(ctx, obj, nil, "w", writeTestCheckpoint(t, t.TempDir(), 300)); err != nil {
		t.Fatal(err)
	}
	if dir, step, err := PullNewestWeights(ctx, obj, "w", root, none); err != nil || step != 300 {
		t.Fatalf("pull after step 300 was pushed: %q step %d, %v", dir, step, err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 1 || entries[0].Name() != "step-0000300" {
		t.Fatalf("after the newer pull %s holds %v; want step-0000300 alone", root, entries)
	}
}

// A pull whose step is already in place, whole (another process's pull,
// renamed there while this one downloaded), leaves that directory as it
// is, where it was removed and replaced under whoever was reading it.
func TestPullLeavesAWholeCopyInPlace(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	if _, err := Push(ctx, obj, nil, "c", writeTestCheckpoint(t, t.TempDir(), 100)); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dir, err := Pull(ctx, obj, "c", 100, root)
	if err != nil {
		t.Fatal(err)
	}
	was := inode(t, dir)
	if again, err := Pull(ctx, obj, "c", 100, root); err != nil || again != dir {
		t.Fatalf("pull again: %q, %v", again, err)
	}
	if inode(t, dir) != was {
		t.Fatal("the pull removed the whole copy in place and renamed its own over it")
	}
	// One that is not whole is replaced.
	if err := os.Truncate(filepath.Join(dir, trainer.ModelFile), 10); err != nil {
		t.Fatal(err)
	}
	if again, err := Pull(ctx, obj, "c", 100, root); err != nil || again != dir {
		t.Fatalf("pull over a damaged copy: %q, %v", again, err)
	}
	if _, err := trainer.VerifyCheckpoint(dir); err != nil {
		t.Fatalf("after the pull over a damaged copy: %v", err)
	}
}
