package trainer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
)

// A checkpoint this user may not read (another user wrote it: checkpoint
// directories are private to their writer) is not damaged: the resume
// refuses it as bad input that names it, and it is neither set aside nor
// passed over for an older one. So whether its directory is closed to
// this user (every file check stops there) or only its files are (the
// files are found, and reading them fails), and whether the resume
// verifies the checkpoint or reads it.
func TestACheckpointThisUserCannotReadIsNotSetAside(t *testing.T) {
	if root := os.Getenv("KILN_TEST_UNREADABLE_ROOT"); root != "" {
		// The child, run as another user than the checkpoint's writer.
		fmt.Print(resumeVerdict(root, os.Getenv("KILN_TEST_UNREADABLE_HOW")))
		return
	}
	for _, c := range []struct{ closed, how string }{{"dir", "verify"}, {"files", "verify"}, {"files", "read"}} {
		t.Run(c.closed+" "+c.how, func(t *testing.T) {
			parent := t.TempDir()
			root := filepath.Join(parent, "run")
			ctx := context.Background()
			older, err := WriteCheckpoint(ctx, root, testSnapshot(t, 10))
			if err != nil {
				t.Fatal(err)
			}
			newest, err := WriteCheckpoint(ctx, root, testSnapshot(t, 20))
			if err != nil {
				t.Fatal(err)
			}
			var out string
			if os.Getuid() == 0 {
				// Root reads anything: the resume runs in a child process
				// of another user, from a copy of this test binary it may
				// execute. t.TempDir's directories are private too.
				for _, d := range []string{filepath.Dir(parent), parent, root} {
					if err := os.Chmod(d, 0o755); err != nil {
						t.Fatal(err)
					}
				}
				openAll(t, older)
				if c.closed == "files" {
					// The directory and its state open to all, the files
					// it lists not (0600, as written under umask 077):
					// they are found, and reading them fails.
					openAll(t, newest)
					ents, err := os.ReadDir(newest)
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range ents {
						if e.Name() == StateFile {
							continue
						}
						if err := os.Chmod(filepath.Join(newest, e.Name()), 0o600); err != nil {
							t.Fatal(err)
						}
					}
				}
				bin := filepath.Join(parent, "trainer.test")
				if err := copyFile(os.Args[0], bin); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(bin, "-test.run=^TestACheckpointThisUserCannotReadIsNotSetAside$")
				cmd.Env = append(os.Environ(), "KILN_TEST_UNREADABLE_ROOT="+root, "KILN_TEST_UNREADABLE_HOW="+c.how)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
				b, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("the child as uid 65534: %v\n%s", err, b)
				}
				out = string(b)
			} else {
				closed := newest
				if c.closed == "files" {
					closed = filepath.Join(newest, ModelFile)
				}
				if err := os.Chmod(closed, 0o000); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Chmod(closed, 0o700) })
				out = resumeVerdict(root, c.how)
			}
			t.Logf("the resume said: %s", out)
			if !strings.Contains(out, "damaged=false bad-input=true err=checkpoint "+newest+" cannot be read by this user") {
				t.Fatalf("the resume of a checkpoint this user cannot read said:\n%s\nwant bad input naming %s, not damage", out, newest)
			}
			if _, err := os.Stat(newest); err != nil {
				t.Fatalf("the unreadable checkpoint was moved: %v", err)
			}
			if _, err := os.Stat(newest + ".damaged"); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the unreadable checkpoint was set aside as damaged: %v", err)
			}
		})
	}
}

// resumeVerdict resumes from root's newest usable checkpoint as the
// trainer does, verifying each (LatestIntactCheckpoint) or reading each
// (ReadCheckpoint), and says how that ended.
func resumeVerdict(root, how string) string {
	var err error
	if how == "read" {
		_, err = newestUsable(root, zap.NewNop(), func(dir string) error {
			_, err := ReadCheckpoint(dir, nil)
			return err
		})
	} else {
		_, _, err = LatestIntactCheckpoint(root, zap.NewNop())
	}
	return fmt.Sprintf("damaged=%v bad-input=%v err=%v\n", errors.Is(err, ErrDamaged), isBadInput(err), err)
}

// openAll makes dir and everything in it readable by every user.
func openAll(t *testing.T, dir string) {
	t.Helper()
	if err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	}); err != nil {
		t.Fatal(err)
	}
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}
