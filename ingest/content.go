package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// A local file's identity in a store is its content, not the glob or the
// path spelling that found it: the same files planned again under another
// glob (data/*.jsonl, ./data/*.jsonl, data//*.jsonl) must append nothing,
// and a file recorded as skipped (corrupt) must be read again once it is
// fixed, which a path-based id would never allow.

// LocalShardID is the exactly-once key of a local file whose content is
// size bytes with the given SHA-256.
func LocalShardID(size int64, sha256Hex string) string {
	return fmt.Sprintf("local/sha256-%s-%d", sha256Hex, size)
}

// legacyShardID is the id a local file had when ids were paths (the glob's
// dataset name and the path): a store made then holds its files under it,
// and planning them again under the same glob must still find them done.
func legacyShardID(p Preset, path string) string { return p.Name + "/" + path }

// fileShardID is a planned file's exactly-once key: the hub path for hub
// datasets, the content for local ones (hashLocal must have run).
func fileShardID(p Preset, f hub.File) string {
	if p.Glob != "" && f.LFS != nil {
		return LocalShardID(f.LFS.Size, f.LFS.OID)
	}
	return ShardID(p, f.Path)
}

// hashFile reads path whole and returns its size and SHA-256.
func hashFile(ctx context.Context, path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", fmt.Errorf("hashing local file %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, ctxReader{ctx, f})
	if err != nil {
		return 0, "", fmt.Errorf("hashing local file %s: %w", path, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// hashLocal sets each local file's size and SHA-256 (as hub.File.LFS, the
// same fields a hub file's content is described by), a few files at once.
func hashLocal(ctx context.Context, files []hub.File) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, min(4, runtime.GOMAXPROCS(0))))
	for i := range files {
		g.Go(func() error {
			size, sum, err := hashFile(ctx, files[i].Path)
			if err != nil {
				return err
			}
			files[i].Size, files[i].LFS = size, &hub.LFS{OID: sum, Size: size}
			return nil
		})
	}
	return g.Wait()
}

// ChangedFileError is a local file whose content is no longer what its
// ingest was planned with: its id names the old content.
type ChangedFileError struct {
	Path       string
	Size       int64
	SHA256     string
	WantSize   int64
	WantSHA256 string
}

func (e *ChangedFileError) Error() string {
	return fmt.Sprintf("local file %s changed since its ingest was planned (%d bytes, sha256 %s; planned %d bytes, sha256 %s): plan the ingest again",
		e.Path, e.Size, e.SHA256, e.WantSize, e.WantSHA256)
}

// BadInput is true: a retry would read the same changed file.
func (e *ChangedFileError) BadInput() bool { return true }

// checkLocalContent refuses a local file whose content differs from what
// the job was planned with. A job planned without a hash (queued before
// ids were contents) is not checked.
func checkLocalContent(ctx context.Context, job ShardJob) error {
	if job.SHA256 == "" {
		return nil
	}
	size, sum, err := hashFile(ctx, job.Path)
	if err != nil {
		return err
	}
	if size != job.Size || sum != job.SHA256 {
		return &ChangedFileError{Path: job.Path, Size: size, SHA256: sum, WantSize: job.Size, WantSHA256: job.SHA256}
	}
	return nil
}

// ctxReader stops a long read when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}
