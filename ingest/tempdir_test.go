package ingest

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// holdTempEnv makes TestHelperHoldTempDir hold a temporary directory in the
// directory it names.
const holdTempEnv = "KILN_TEST_HOLD_TEMP"

// TestHelperHoldTempDir is the process of TestRemoveStaleTemp that holds a
// directory: it prints the directory's path, waits for its stdin to close,
// and removes it.
func TestHelperHoldTempDir(t *testing.T) {
	dir := os.Getenv(holdTempEnv)
	if dir == "" {
		t.Skip("a helper process of TestRemoveStaleTemp")
	}
	d, err := MkdirTemp(dir, shardsPattern)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Path, "shard.tokens"), []byte("tokens"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString(d.Path + "\n")
	io.Copy(io.Discard, os.Stdin)
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
}

// The directory of a process killed by SIGKILL is removed by the next
// cleaner; those of a live process, and of the cleaner's own, are kept
// with what they hold, as is anything not named from the pattern.
func TestRemoveStaleTemp(t *testing.T) {
	dir := t.TempDir()
	killed := testsvc.StartChild(t, "TestHelperHoldTempDir", holdTempEnv+"="+dir)
	killed.Kill(t)
	live := testsvc.StartChild(t, "TestHelperHoldTempDir", holdTempEnv+"="+dir)
	own, err := MkdirTemp(dir, shardsPattern)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "other-1"), filepath.Join(dir, ".shards-file")} {
		if strings.HasSuffix(p, "file") {
			err = os.WriteFile(p, nil, 0o644)
		} else {
			err = os.Mkdir(p, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(killed.Line, "shard.tokens")); err != nil {
		t.Fatalf("the killed process's directory before the cleaner: %v", err)
	}

	removed, err := RemoveStaleTemp(dir, shardsPattern)
	if err != nil || !slices.Equal(removed, []string{killed.Line}) {
		t.Fatalf("removed %v, %v; want only the killed process's %s", removed, err, killed.Line)
	}
	if _, err := os.Stat(killed.Line); !os.IsNotExist(err) {
		t.Fatalf("the killed process's directory after the cleaner: %v", err)
	}
	for _, p := range []string{filepath.Join(live.Line, "shard.tokens"), own.Path, filepath.Join(dir, "other-1"), filepath.Join(dir, ".shards-file")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("the cleaner removed %s: %v", p, err)
		}
	}

	// Their owners remove them; a cleaner finding nothing stale is quiet.
	live.Release(t)
	if err := own.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{live.Line, own.Path} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s after its owner removed it: %v", p, err)
		}
	}
	if removed, err := RemoveStaleTemp(dir, shardsPattern); err != nil || len(removed) != 0 {
		t.Fatalf("removed %v, %v; want nothing", removed, err)
	}
	if removed, err := RemoveStaleTemp(filepath.Join(dir, "absent"), shardsPattern); err != nil || len(removed) != 0 {
		t.Fatalf("in a missing directory: removed %v, %v; want nothing", removed, err)
	}
}

// Cleaners running all the while directories are made never take one
// that MkdirTemp returned: a directory they take between its mkdir and
// its flock is given up by its maker, which makes another.
func TestMkdirTempBesideCleaners(t *testing.T) {
	dir := t.TempDir()
	done := make(chan struct{})
	cleaned := make(chan error, 2)
	for range 2 {
		go func() {
			for {
				select {
				case <-done:
					cleaned <- nil
					return
				default:
				}
				if _, err := RemoveStaleTemp(dir, shardsPattern); err != nil {
					cleaned <- err
					return
				}
			}
		}()
	}
	made := make(chan error, 4)
	for range 4 {
		go func() {
			for range 200 {
				d, err := MkdirTemp(dir, shardsPattern)
				if err != nil {
					made <- err
					return
				}
				f := filepath.Join(d.Path, "shard.tokens")
				if err := os.WriteFile(f, []byte("tokens"), 0o644); err != nil {
					made <- err
					return
				}
				if _, err := os.Stat(f); err != nil {
					made <- err
					return
				}
				if err := d.Remove(); err != nil {
					made <- err
					return
				}
			}
			made <- nil
		}()
	}
	for range 4 {
		if err := <-made; err != nil {
			t.Error(err)
		}
	}
	close(done)
	for range 2 {
		if err := <-cleaned; err != nil {
			t.Error(err)
		}
	}
}
