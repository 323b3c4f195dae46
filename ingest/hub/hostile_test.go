package hub_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// A file whose body goes on past the size its listing gives (a broken or
// hostile mirror or CDN) is written no further than that size, and its
// download fails at once, naming the file, the size the tree lists and
// what the server sends, as the server's fault: not as a full disk after
// it filled the disk that the token stores share. The file is removed,
// and the remedy is not to ask the same server again. The process may
// write no file past the listed size while the body has no end
// (RLIMIT_FSIZE: a write past it fails with EFBIG).
func TestADownloadLongerThanItsListingStopsAtItsSize(t *testing.T) {
	content := []byte(`{"text":"thirty bytes long"}` + "\n\n")
	cases := []struct {
		name string
		lfs  bool // served by the CDN, else by the Hub itself
		body hubtest.Body
		sent string // what the error says the server sends
	}{
		{"without-end", true, hubtest.Body{Extra: -1}, "the server's answer goes on past them, with no length given"},
		{"with-its-length", false, hubtest.Body{Extra: 1000, Length: true}, "the server sends 1030"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(t)
			h.Add(repo, "data/a.jsonl", content, tc.lfs)
			h.SetBody(repo, "data/a.jsonl", tc.body)
			c := newClient(t, h, "")
			ctx := context.Background()
			commit, err := c.ResolveRevision(ctx, repo, "main")
			if err != nil {
				t.Fatal(err)
			}
			files, err := c.List(ctx, repo, commit, "data")
			if err != nil || len(files) != 1 {
				t.Fatalf("the listing: %+v, %v", files, err)
			}
			dst := filepath.Join(t.TempDir(), "a.jsonl")
			before := len(h.Requests())
			err = downloadWithin(t, int64(len(content)), func() error { return c.Download(ctx, repo, commit, files[0], dst) })
			if err == nil || errors.Is(err, syscall.EFBIG) {
				t.Fatalf("a body longer than the %d bytes listed: %v; want it refused before a byte past them is written", len(content), err)
			}
			for _, w := range []string{"downloading data/a.jsonl of dataset " + repo, "got more than the 30 bytes the tree lists", tc.sent,
				"the file was removed", "commit " + commit, "a mirror, proxy or CDN between here and HF_ENDPOINT " + h.Server.URL, "run the ingest again"} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("a body longer than its listing says %q; want %q", err, w)
				}
			}
			if strings.HasSuffix(err.Error(), "retry") || strings.Contains(err.Error(), "no space") {
				t.Fatalf("a body longer than its listing says %q: a retry asks the same server, and the disk is not at fault", err)
			}
			for _, p := range []string{dst, dst + ".part"} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Fatalf("%s was left after a body longer than its listing", p)
				}
			}
			if n := h.Downloads(before)["data/a.jsonl"]; n != 1 {
				t.Fatalf("the Hub was asked %d times for the file; want once: asked again, it sends the same", n)
			}
		})
	}
}

// downloadWithin runs download with the process unable to write a file
// past limit bytes, and returns its error.
func downloadWithin(t *testing.T, limit int64, download func() error) error {
	t.Helper()
	var was unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &was); err != nil {
		t.Fatal(err)
	}
	// SIGXFSZ, which a write past the limit raises, does nothing to a Go
	// program that does not ask for it: the write fails with EFBIG.
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: uint64(limit), Max: was.Max}); err != nil {
		t.Skipf("limiting the size of files written: %v", err)
	}
	defer unix.Setrlimit(unix.RLIMIT_FSIZE, &was)
	return download()
}

// A size mismatch's remedy is not to retry, which asks the same server
// and meets the same: at a commit, whose files never change on the Hub,
// it names the mirror, proxy or CDN between here and HF_ENDPOINT; at a
// branch, it says the file may have changed since it was listed. Both say
// to run the ingest again, which lists the dataset anew.
func TestADownloadThatDiffersFromItsListingSaysWhatToDo(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "data/a.parquet", randomBytes(t, 1000), true)
	c := newClient(t, h, "")
	ctx := context.Background()
	commit, err := c.ResolveRevision(ctx, repo, "main")
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.List(ctx, repo, commit, "data")
	if err != nil {
		t.Fatal(err)
	}
	f := files[0]
	f.LFS.OID = strings.Repeat("0", 64)
	for rev, want := range map[string]string{
		commit: "the Hub serves the same bytes for a file at a commit, so a mirror, proxy or CDN between here and HF_ENDPOINT " + h.Server.URL + " sent other bytes than its listing of commit " + commit + " gives",
		"main": "the file may have changed at main since it was listed",
	} {
		err := c.Download(ctx, repo, rev, f, filepath.Join(t.TempDir(), "a.parquet"))
		if err == nil || !strings.Contains(err.Error(), "sha256 mismatch") {
			t.Fatalf("at %s: want a sha256 mismatch, got %v", rev, err)
		}
		for _, w := range []string{want, "run the ingest again (sched enqueue ingest, or sched ingest --direct), which lists the dataset anew"} {
			if !strings.Contains(err.Error(), w) || strings.HasSuffix(err.Error(), "retry") {
				t.Fatalf("at %s: a mismatch says %q; want %q, and no retry", rev, err, w)
			}
		}
	}
}

// A body that trickles (a byte every 10 ms against a floor of 2,000 bytes
// a second) never stalls, yet would hold a download for good: each window
// of it that brings less than the floor is abandoned as a stall is, and
// resumed with Range from its last byte; after MaxRetries more such
// windows the download fails, naming the file and the rate. A download of
// another file on the same client, at the speed of the machine, is whole.
func TestADownloadThatTricklesFailsAsStalled(t *testing.T) {
	h := newHub(t)
	slow, fast := randomBytes(t, 300), randomBytes(t, 100_000)
	h.Add(repo, "data/a.parquet", slow, true)
	h.Add(repo, "data/b.parquet", fast, true)
	h.SetBody(repo, "data/a.parquet", hubtest.Body{Every: 10 * time.Millisecond})
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 2, MaxWait: time.Millisecond,
		MinRate: 2000, RateWindow: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notes []string
	ctx := hub.WithRetryNotice(context.Background(), func(msg string) {
		mu.Lock()
		notes = append(notes, msg)
		mu.Unlock()
	})
	files, err := c.List(ctx, repo, "main", "data")
	if err != nil || len(files) != 2 {
		t.Fatalf("the listing: %+v, %v", files, err)
	}
	dst := filepath.Join(t.TempDir(), "a.parquet")
	err = c.Download(ctx, repo, "main", files[0], dst)
	if err == nil {
		t.Fatal("a download that trickles at 100 bytes a second against a floor of 2000 was whole; want it given up on")
	}
	for _, w := range []string{"downloading data/a.parquet of dataset " + repo + ": too slow 3 times in a row", "B/s), under the 2.0 KiB/s a download must keep up (the connection stalled)"} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("a download that trickles says %q; want %q", err, w)
		}
	}
	var from []int64 // the first byte each CDN request asked for
	for _, r := range h.Requests() {
		if r.Host == "cdn" {
			var n int64
			fmt.Sscanf(r.Range, "bytes=%d-", &n)
			from = append(from, n)
		}
	}
	if len(from) != 3 || from[0] != 0 || from[1] <= 0 || from[2] <= from[1] {
		t.Fatalf("the CDN was asked for the file from bytes %v; want from 0, then twice more, each from further on", from)
	}
	mu.Lock()
	said := strings.Join(notes, "\n")
	mu.Unlock()
	if !strings.Contains(said, "the download was too slow at byte") {
		t.Fatalf("the task was told %q; want that the download was too slow", said)
	}

	dst = filepath.Join(t.TempDir(), "b.parquet")
	if err := c.Download(ctx, repo, "main", files[1], dst); err != nil {
		t.Fatalf("a download at the machine's speed, under the same floor: %v", err)
	}
}

// A listing whose pages go on and on, each linking to a new cursor (a
// broken or hostile mirror), is refused once it passes MaxEntries, naming
// the dataset, the bound and HF_ENDPOINT, after no more pages than the
// bound takes: it held every entry until the process was killed for it.
// A listing of as many entries as the bound is read whole.
func TestAListingPastItsBoundIsRefused(t *testing.T) {
	var hubs []*hubtest.Hub
	// morePages is a stand-in for pages without end that ends, so that
	// a listing without a bound ends too: 100,000 entries past the real.
	for _, morePages := range []int{0, 10_000} {
		h := newHub(t)
		h.PageSize, h.MorePages = 10, morePages
		for _, p := range []string{"data/a.parquet", "data/b.parquet", "data/c.parquet", "data/d.parquet", "data/e.parquet"} {
			h.Add(repo, p, []byte(p), false)
		}
		hubs = append(hubs, h)
	}
	c, err := hub.New(hub.Config{Endpoint: hubs[0].Server.URL, MaxEntries: 5})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if files, err := c.List(ctx, repo, "main", "data"); err != nil || len(files) != 5 {
		t.Fatalf("a listing of 5 files under a bound of 5: %d files, %v", len(files), err)
	}

	h := hubs[1]
	c, err = hub.New(hub.Config{Endpoint: h.Server.URL, MaxEntries: 100})
	if err != nil {
		t.Fatal(err)
	}
	before := len(h.Requests())
	files, err := c.List(ctx, repo, "main", "data")
	if err == nil {
		t.Fatalf("a listing of pages without end: %d files, no error; want it refused past 100 entries", len(files))
	}
	for _, w := range []string{"listing dataset " + repo + " at main: the Hub's listing goes on past 100 entries", "HF_ENDPOINT " + h.Server.URL} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("a listing of pages without end says %q; want %q", err, w)
		}
	}
	if n := len(h.Requests()) - before; n != 11 {
		t.Fatalf("the listing read %d pages of 10 entries; want 11, the first past the bound of 100", n)
	}
}
