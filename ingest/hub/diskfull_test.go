package hub_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A download whose file cannot take its bytes (a full disk) fails at once
// with the write's error, ENOSPC, after one request for the file: no resume
// asks the Hub again for bytes there is nowhere to put, and the task is not
// told that the connection broke. The full disk is /dev/full, every write
// to which fails with ENOSPC, as the download's .part file; and, where
// this process may mount one, a tmpfs smaller than the file.
func TestADownloadOntoAFullDiskFailsAtOnce(t *testing.T) {
	disks := []struct {
		name string
		dst  func(t *testing.T) string // where the file is downloaded to
	}{
		{"dev-full", func(t *testing.T) string {
			if _, err := os.Stat("/dev/full"); err != nil {
				t.Skipf("no /dev/full here: %v", err)
			}
			dst := filepath.Join(t.TempDir(), "a.parquet")
			if err := os.Symlink("/dev/full", dst+".part"); err != nil {
				t.Fatal(err)
			}
			return dst
		}},
		{"tmpfs", func(t *testing.T) string {
			return filepath.Join(testsvc.SmallDisk(t, 64<<10), "a.parquet")
		}},
	}
	for _, disk := range disks {
		t.Run(disk.name, func(t *testing.T) {
			h := newHub(t)
			h.Add(repo, "data/a.parquet", randomBytes(t, 300_000), true)
			// Short waits, so that a download that resumed would give up
			// soon, after its MaxRetries more requests.
			c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 4, MaxWait: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			var notes []string
			ctx := hub.WithRetryNotice(context.Background(), func(msg string) { notes = append(notes, msg) })
			files, err := c.List(ctx, repo, "main", "data")
			if err != nil {
				t.Fatal(err)
			}
			dst := disk.dst(t)
			before := len(h.Requests())
			err = c.Download(ctx, repo, "main", files[0], dst)
			if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "data/a.parquet") {
				t.Fatalf("a download onto a full disk: %v; want the write's ENOSPC, naming the file", err)
			}
			if n := h.Downloads(before)["data/a.parquet"]; n != 1 {
				t.Fatalf("the Hub was asked %d times for the file; want once: a full disk is not a broken connection", n)
			}
			if len(notes) != 0 || strings.Contains(err.Error(), "connection") {
				t.Fatalf("a download onto a full disk said %q (%v); want no word of a broken connection", notes, err)
			}
		})
	}
}
