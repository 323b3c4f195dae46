package hub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// ResolveURL is the download URL of path at rev in dataset repo.
func (c *Client) ResolveURL(repo, rev, path string) string {
	return fmt.Sprintf("%s/datasets/%s/resolve/%s/%s", c.cfg.Endpoint, repo, url.PathEscape(rev), escapePath(path))
}

// Download fetches f at rev into dst. It writes dst+".part" first, resumes
// that file with a Range request after a broken connection (or a restart),
// checks the size, and checks the LFS sha256 (or the git blob id of a
// small file) before renaming it to dst. A partial file that an earlier
// attempt left and that fails verification (another version of the file,
// bytes damaged on disk) is downloaded again from its start, once; a file
// that fails verification then is removed, so that the next attempt
// starts clean.
func (c *Client) Download(ctx context.Context, repo, rev string, f File, dst string) error {
	if err := checkRepo(repo); err != nil {
		return err
	}
	want, sum := f.Size, newVerifier(f)
	if f.LFS != nil {
		want = f.LFS.Size
	}
	part := dst + ".part"
	out, err := os.OpenFile(part, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("downloading %s: %w", f.Path, err)
	}
	defer out.Close()
	off, err := resumeOffset(out, want, sum)
	if err != nil {
		return fmt.Errorf("downloading %s: reading the partial file %s: %w", f.Path, part, err)
	}

	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	src := c.ResolveURL(repo, rev, f.Path)
	kept := off > 0 // bytes an earlier attempt left
	for {
		err := c.transfer(ctx, repo, rev, f.Path, src, out, sum, &off, want)
		var over *overrunError
		if err != nil && !errors.As(err, &over) {
			return err
		}
		bad := err
		if bad == nil {
			bad = sum.check()
		}
		if off != want && over == nil {
			bad = fmt.Errorf("got %d bytes, the tree lists %d", off, want)
		}
		if bad == nil {
			break
		}
		// A body longer than the file is the server's, whatever an earlier
		// attempt left: asked again, it sends the same.
		if kept && over == nil {
			// What an earlier attempt left may be of another version of
			// the file (its ingest planned again at a newer commit) or
			// damaged on disk: the file is downloaded whole once.
			c.cfg.Logger.Info("the partial download does not match the file; downloading it again from its start", zap.String("path", f.Path), zap.Error(bad))
			if err := out.Truncate(0); err != nil {
				return fmt.Errorf("downloading %s: %w", f.Path, err)
			}
			sum.reset()
			off, kept = 0, false
			continue
		}
		os.Remove(part)
		return fmt.Errorf("downloading %s of dataset %s: %w; the file was removed: %s", f.Path, repo, bad, c.mismatchRemedy(rev))
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("downloading %s: %w", f.Path, err)
	}
	return os.Rename(part, dst)
}

// mismatchRemedy says what to do about a download at rev whose bytes are
// not those the listing gave: asking the same server again meets the same.
func (c *Client) mismatchRemedy(rev string) string {
	named, _ := c.endpointSetting()
	again := "run the ingest again (sched enqueue ingest, or sched ingest --direct), which lists the dataset anew"
	if isCommit(rev) {
		// A file at a commit never changes on the Hub.
		return fmt.Sprintf("the Hub serves the same bytes for a file at a commit, so a mirror, proxy or CDN between here and %s sent other bytes than its listing of commit %s gives; check it, then %s", named, rev, again)
	}
	return fmt.Sprintf("the file may have changed at %s since it was listed, or a mirror, proxy or CDN between here and %s sent other bytes than its listing gives; %s", rev, named, again)
}

// isCommit says whether rev is a full commit id rather than a branch or tag.
func isCommit(rev string) bool {
	if len(rev) != 40 {
		return false
	}
	for _, c := range rev {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// transfer downloads what out lacks of the file at src, from *off to want,
// resuming after each break while it gets further.
func (c *Client) transfer(ctx context.Context, repo, rev, path, src string, out *os.File, sum *verifier, off *int64, want int64) error {
	most := *off // the furthest the file has reached
	for broken := 0; *off < want; {
		err := c.fetchFrom(ctx, repo, src, out, sum, off, want)
		if err == nil && *off < want {
			// A body without a length ends where the connection does: what
			// it lacks is asked for again, like a broken transfer's.
			err = &brokenError{fmt.Errorf("the body ended at byte %d of %d", *off, want)}
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var transient *brokenError
		var gone *RevisionNotFoundError
		var vanished *RepoNotFoundError
		var over *overrunError
		var slow *slowError
		switch {
		case errors.As(err, &over):
			return over // Download says what of, and what to do
		case errors.As(err, &gone) && isCommit(rev):
			// The plan pinned the commit; the preset's revision is fine.
			gone.Commit = rev
			return fmt.Errorf("downloading %s: %w", path, gone)
		case errors.As(err, &vanished) && isCommit(rev):
			// The plan listed the dataset at that commit: it was there.
			vanished.Commit = rev
			return fmt.Errorf("downloading %s: %w", path, vanished)
		case !errors.As(err, &transient):
			return fmt.Errorf("downloading %s of dataset %s: %w", path, repo, err)
		}
		tooSlow := errors.As(err, &slow)
		if *off > most {
			// Further than ever: a flaky link, not a dead one. A server
			// that ignores Range starts each answer over from byte 0, so
			// bytes alone are no progress; nor are those of a trickle,
			// which gets further each time and would never end.
			most = *off
			if !tooSlow {
				broken = 0
			}
		}
		if broken++; broken > c.cfg.MaxRetries {
			if tooSlow {
				return fmt.Errorf("downloading %s of dataset %s: too slow %d times in a row, at byte %d of %d: %w; check the network between here and the Hub (or the CDN it sends downloads to)", path, repo, broken, *off, want, err)
			}
			return fmt.Errorf("downloading %s of dataset %s: the connection broke %d times in a row without getting past byte %d of %d: %w", path, repo, broken, most, want, err)
		}
		c.cfg.Logger.Sugar().Infow("download interrupted, resuming", "path", path, "offset", *off, "error", err)
		wait := min(backoff(broken), c.cfg.MaxWait)
		what := "the connection broke"
		if tooSlow {
			what = "the download was too slow"
		}
		notice(ctx, fmt.Sprintf("%s at byte %d (%v); resuming in %v (attempt %d of %d)", what, *off, err, wait.Round(time.Second/10), broken+1, c.cfg.MaxRetries+1))
		if err := sleep(ctx, wait); err != nil {
			return err
		}
	}
	return nil
}

// brokenError is a body that ended early: the download resumes from there.
type brokenError struct{ err error }

func (e *brokenError) Error() string { return "connection broken: " + e.err.Error() }
func (e *brokenError) Unwrap() error { return e.err }

// fetchFrom requests src from *off on and appends what arrives to out, up
// to want, the file's size: a body that goes on past it is an
// *overrunError, and its bytes past want are never written.
func (c *Client) fetchFrom(ctx context.Context, repo, src string, out *os.File, sum *verifier, off *int64, want int64) error {
	start := *off
	resp, err := c.get(ctx, repo, src, func(r *http.Request) {
		// Identity: a transparently gunzipped body would not match byte offsets.
		r.Header.Set("Accept-Encoding", "identity")
		if start > 0 {
			r.Header.Set("Range", "bytes="+strconv.FormatInt(start, 10)+"-")
		}
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case start > 0 && resp.StatusCode == http.StatusOK:
		// The server ignored the Range: start over rather than append twice.
		if err := out.Truncate(0); err != nil {
			return err
		}
		sum.reset()
		start, *off = 0, 0
	case resp.StatusCode == http.StatusPartialContent:
		if got := contentRangeStart(resp.Header.Get("Content-Range")); got != start {
			return fmt.Errorf("asked for bytes from %d, the server sent from %d (Content-Range %q)", start, got, resp.Header.Get("Content-Range"))
		}
	}
	if _, err := out.Seek(start, io.SeekStart); err != nil {
		return err
	}
	if body, ok := resp.Body.(*watchedBody); ok {
		body.minRate(c.cfg.MinRate, c.cfg.RateWindow, "a download")
	}
	// No more than the file's size: a server that sends without end (a
	// broken mirror, or a hostile one) would otherwise fill the disk that
	// the token stores and checkpoints share.
	n, err := io.Copy(partWriter{out, sum}, io.LimitReader(resp.Body, want-start))
	*off += n
	var werr *writeError
	if errors.As(err, &werr) {
		// The disk, not the connection: a full disk (ENOSPC, EDQUOT) or
		// a failing one (EIO) is no better on the next request, and
		// resuming would ask the Hub again for bytes there is nowhere to
		// put. The caller says which directory lacks room.
		return werr.err
	}
	if err != nil {
		return &brokenError{err}
	}
	if *off < want {
		return nil
	}
	// One byte more says whether the body ends with the file; one whose
	// length is the file's ends here without a read of the connection.
	if extra, _ := io.ReadFull(resp.Body, make([]byte, 1)); extra > 0 {
		sent := int64(-1)
		if resp.ContentLength >= 0 {
			sent = start + resp.ContentLength
		}
		return &overrunError{want: want, sent: sent}
	}
	// Anything else past the file's bytes (the connection closed, or a
	// stall before the body's end) leaves them whole: the sums say.
	return nil
}

// overrunError is a download whose body goes on past the size the
// listing gives the file.
type overrunError struct {
	want int64 // the listed size
	sent int64 // the body's whole length, where its Content-Length said; else -1
}

func (e *overrunError) Error() string {
	if e.sent >= 0 {
		return fmt.Sprintf("got more than the %d bytes the tree lists: the server sends %d", e.want, e.sent)
	}
	return fmt.Sprintf("got more than the %d bytes the tree lists: the server's answer goes on past them, with no length given", e.want)
}

// partWriter writes a download's bytes to its .part file and hashes those
// the file took; a failed write is a *writeError, told apart from a read
// of the body that failed.
type partWriter struct {
	f   *os.File
	sum *verifier
}

func (w partWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.sum.Write(p[:n])
	if err != nil {
		return n, &writeError{err}
	}
	return n, nil
}

// writeError is a write to the .part file that failed.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// contentRangeStart parses the first byte position of "bytes 100-199/200".
func contentRangeStart(h string) int64 {
	s, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return -1
	}
	first, _, _ := strings.Cut(s, "-")
	v, err := strconv.ParseInt(first, 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// resumeOffset hashes what a previous attempt left in out and returns where
// to continue; a partial file longer than the target is discarded.
func resumeOffset(out *os.File, want int64, sum *verifier) (int64, error) {
	st, err := out.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() > want {
		return 0, out.Truncate(0)
	}
	n, err := io.Copy(sum, io.NewSectionReader(out, 0, st.Size()))
	return n, err
}

// verifier hashes a download as it arrives and checks it at the end.
type verifier struct {
	kind string // "sha256", "git-sha1", or "" when the tree gave no id
	want string
	size int64
	h    hash.Hash
}

func newVerifier(f File) *verifier {
	v := &verifier{}
	switch {
	case f.LFS != nil && len(f.LFS.OID) == 64:
		v.kind, v.want, v.size = "sha256", strings.ToLower(f.LFS.OID), f.LFS.Size
	case f.LFS == nil && len(f.OID) == 40:
		v.kind, v.want, v.size = "git-sha1", strings.ToLower(f.OID), f.Size
	}
	v.reset()
	return v
}

func (v *verifier) reset() {
	switch v.kind {
	case "sha256":
		v.h = sha256.New()
	case "git-sha1":
		v.h = sha1.New()
		fmt.Fprintf(v.h, "blob %d\x00", v.size)
	}
}

func (v *verifier) Write(p []byte) (int, error) {
	if v.h != nil {
		v.h.Write(p)
	}
	return len(p), nil
}

func (v *verifier) check() error {
	if v.h == nil {
		return nil
	}
	if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want {
		return fmt.Errorf("%s mismatch: got %s, the hub lists %s", v.kind, got, v.want)
	}
	return nil
}

// ReadRange returns n bytes of path at rev from offset off, through a Range
// request: enough to read a parquet footer or the first lines of a file
// without downloading it. An answer that stalls or trickles (MinRate) is
// asked for again, as a request that failed is.
func (c *Client) ReadRange(ctx context.Context, repo, rev, path string, off, n int64) ([]byte, error) {
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	var buf []byte
	_, err := c.getRead(ctx, repo, c.ResolveURL(repo, rev, path), func(r *http.Request) {
		r.Header.Set("Accept-Encoding", "identity")
		r.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	}, func(resp *http.Response) error {
		if resp.StatusCode != http.StatusPartialContent {
			return fmt.Errorf("the server ignored the Range request (%s)", resp.Status)
		}
		buf = make([]byte, n)
		got, err := io.ReadFull(resp.Body, buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return err
		}
		// A file shorter than the range ends early.
		buf = buf[:got]
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s of dataset %s: %w", path, repo, err)
	}
	return buf, nil
}
