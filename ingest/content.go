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

// ChangedFileError is a local file whose bytes, read for its shard, are
// not the content its ingest was planned with: the shard's id names that
// content (LocalShardID), so a shard of other bytes would stand for it in
// the store for good, and the file as it is now could never go in.
type ChangedFileError struct {
	Path string
	// WantSize and WantSHA256 are the content the ingest was planned
	// with; Size and SHA256 the bytes read.
	WantSize   int64
	WantSHA256 string
	Size       int64
	SHA256     string
	// Reading is set where the file changed while it was read: it was
	// being written, and a later try, once it is settled, may read the
	// content planned. Otherwise it held other content from the start of
	// the read, and only a new plan can take it.
	Reading bool
	// Since says how the file changed after the bytes read, which were
	// those planned ("" where they were not).
	Since string
}

func (e *ChangedFileError) Error() string {
	switch {
	case e.Since != "":
		return fmt.Sprintf("local file %s changed while it was read (it was %d bytes with SHA-256 %s when planned and as read, and %s): run the ingest again once nothing writes to it",
			e.Path, e.WantSize, e.WantSHA256, e.Since)
	case e.Reading:
		return fmt.Sprintf("local file %s changed while it was read (it was %d bytes with SHA-256 %s when planned, %d bytes / %s as read): run the ingest again once nothing writes to it",
			e.Path, e.WantSize, e.WantSHA256, e.Size, e.SHA256)
	}
	return fmt.Sprintf("local file %s changed since its ingest was planned (it was %d bytes with SHA-256 %s then, and is %d bytes / %s now): its shard's id names the content planned, which no retry can read now; run the ingest again (sched enqueue ingest, or sched ingest --direct), which plans the file as it is now, once nothing writes to it",
		e.Path, e.WantSize, e.WantSHA256, e.Size, e.SHA256)
}

// BadInput is true where the file held other content from the start of
// the read: a retry of the same shard would read it again. One that
// changed while it was read is tried again.
func (e *ChangedFileError) BadInput() bool { return !e.Reading && e.Since == "" }

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
