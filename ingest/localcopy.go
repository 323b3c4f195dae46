package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"go.uber.org/zap"
)

// A local file is tokenized from a private copy, made and hashed in one
// pass and checked against the content its ingest was planned with, which
// its shard's id names (LocalShardID). Read in place after its hash was
// checked, a file could change under the reader: one cut short while it was
// tokenized stored half its documents under the whole file's id, and the
// rest could never go in; one grown stored more than its id's content,
// which the next ingest stored again. The copy is the bytes hashed and
// nothing else writes it, so a shard holds the content its id names, or
// there is no shard. A hub file is read from its download the same way.
// The bytes could be hashed as the readers take them, without a copy, but
// a parquet reader takes the column chunks it needs, at their offsets, not
// the whole file in order.
//
// The copy takes the file's size on the data directory's disk, as a
// download does, from the start of its shard until it is tokenized, and a
// write of the file's bytes: 256 MB from the page cache took 0.25 s, and
// the hash alone, which it replaces, 0.19 s (a 2-vCPU VM).

// copyChunk is how much of a local file each read of its copy takes.
const copyChunk = 1 << 20

// readStage is how far the read of a local file for its shard has come,
// for Pipeline.onRead.
type readStage int

const (
	// readCopying: the first chunk of the file is copied, the rest not
	// yet.
	readCopying readStage = iota + 1
	// readCopied: the copy is checked against the plan; it is tokenized
	// next.
	readCopied
)

// localCopy is the private copy of a local file that its shard is
// tokenized from.
type localCopy struct {
	// path is the copy's, named as the file is: its name tells its format.
	path string
	src  string
	// size and sum are the planned content, which the copy holds.
	size int64
	sum  string
	// at is the file as its copy began to read it.
	at   fs.FileInfo
	held *TempDir
}

// copyLocal copies the job's local file into a directory of its own,
// hashing it on the way, and checks the copy against the content the job
// was planned with: a file whose bytes, as read, were not that content is
// a *ChangedFileError, and leaves no copy.
func (p *Pipeline) copyLocal(ctx context.Context, job ShardJob) (*localCopy, error) {
	held, err := p.copyDir(job)
	if err != nil {
		return nil, err
	}
	c := &localCopy{path: filepath.Join(held.Path, filepath.Base(job.Path)), src: job.Path, size: job.Size, sum: job.SHA256, held: held}
	if err := c.fill(ctx, p.onRead); err != nil {
		c.remove(p.log())
		return nil, noRoom(err, held.Path, fmt.Sprintf("a copy of the %d bytes of %s, which its shard is read from", job.Size, job.Path))
	}
	if p.onRead != nil {
		p.onRead(readCopied, job.Path)
	}
	return c, nil
}

// copyDir is the directory, held, that the job's local file is copied
// into: its download directory under the data directory.
func (p *Pipeline) copyDir(job ShardJob) (*TempDir, error) {
	if p.DataDir == "" {
		// A pipeline with no data directory (a test's) copies into the
		// system's temporary directory.
		return MkdirTemp("", "kiln-copy-*")
	}
	p.removeStaleDownloads()
	return holdDownload(downloadDir(p.DataDir, job.Store, job.ShardID))
}

// fill copies the file into c.path and checks what it read against the
// planned content.
func (c *localCopy) fill(ctx context.Context, onRead func(readStage, string)) error {
	in, err := os.Open(c.src)
	if err != nil {
		return fmt.Errorf("reading local file: %w", err)
	}
	defer in.Close()
	if c.at, err = in.Stat(); err != nil {
		return fmt.Errorf("reading local file: %w", err)
	}
	out, err := os.OpenFile(c.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("copying local file %s: %w", c.src, err)
	}
	h := sha256.New()
	n, err := c.copy(ctx, out, h, in, func() {
		if onRead != nil {
			onRead(readCopying, c.src)
		}
	})
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying local file %s: %w", c.src, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if n == c.size && sum == c.sum {
		return nil
	}
	return &ChangedFileError{Path: c.src, WantSize: c.size, WantSHA256: c.sum, Size: n, SHA256: sum, Reading: c.changed() != ""}
}

// copy reads in to its end into h, and into out up to the planned size:
// the bytes past it, of a file grown, are hashed for the error to say what
// was read, and not kept. first is called after the first read.
func (c *localCopy) copy(ctx context.Context, out io.Writer, h hash.Hash, in io.Reader, first func()) (int64, error) {
	buf := make([]byte, copyChunk)
	var n int64
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, rerr := in.Read(buf)
		h.Write(buf[:k])
		if keep := min(int64(k), max(c.size-n, 0)); keep > 0 {
			if _, err := out.Write(buf[:keep]); err != nil {
				return n, err
			}
		}
		n += int64(k)
		if i == 0 {
			first()
		}
		switch {
		case errors.Is(rerr, io.EOF):
			return n, nil
		case rerr != nil:
			return n, rerr
		}
	}
}

// changed says how the file differs from what it was when its copy began
// to read it ("" where it does not): another file at its path, another
// size or modification time.
func (c *localCopy) changed() string {
	now, err := os.Stat(c.src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "has been removed since"
	case err != nil:
		return fmt.Sprintf("could not be looked at again (%v)", err)
	case !os.SameFile(c.at, now):
		return "another file has taken its path since"
	case now.Size() != c.at.Size():
		return fmt.Sprintf("is %d bytes now", now.Size())
	case !now.ModTime().Equal(c.at.ModTime()):
		return "has been written to since"
	}
	return ""
}

// settled is nil, or the *ChangedFileError of a file changed since its
// copy began. The copy holds the planned content all the same, but a file
// that changes meanwhile is being written: its shard would hold content it
// held only in passing, and an ingest run once it is written would store
// its final content beside it (a file grown meanwhile: its first
// documents twice).
func (c *localCopy) settled() error {
	if s := c.changed(); s != "" {
		return &ChangedFileError{Path: c.src, WantSize: c.size, WantSHA256: c.sum, Size: c.size, SHA256: c.sum, Since: s}
	}
	return nil
}

// remove removes the copy and its directory.
func (c *localCopy) remove(log *zap.Logger) {
	if err := c.held.Remove(); err != nil {
		log.Warn("the copy a local file was read from is not removed; a later shard removes it", zap.String("dir", c.held.Path), zap.Error(err))
	}
}
