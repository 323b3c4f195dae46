package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
)

// idleParts is how many part buffers an S3 store keeps for its next puts
// of unknown size once a put is done with them: the two buffers each of
// two shards tokenizing at once.
const idleParts = 4

// partPool keeps idle part buffers for the streamed puts of one S3 store,
// so that a worker's shards reuse them instead of each allocating (and
// zeroing) two fresh ones: 0.14-0.16 CPU-s per GB of shard tokens on the
// 2-vCPU VM (docs/benchmarks/ingest.md). It holds at most cap(idle)
// buffers; one given back beyond that is left to the GC, so the pool
// never holds more than the puts at their busiest had in use.
type partPool struct {
	size int
	idle chan []byte
}

func (p *partPool) get() []byte {
	select {
	case b := <-p.idle:
		return b
	default:
		return make([]byte, p.size)
	}
}

func (p *partPool) put(b []byte) {
	if b == nil {
		return
	}
	select {
	case p.idle <- b[:p.size]:
	default:
	}
}

// abortTimeout bounds the request that drops an unfinished multipart
// upload; it is sent even when the writer's context has ended.
const abortTimeout = time.Minute

// s3Writer streams one object as a multipart upload from two part buffers:
// Write fills one while the other's part uploads, so the writer waits for
// a part's round trip only when it has filled the next part first. The
// upload starts when the first part is full; an object that fits in one
// part goes as a single PUT at Close. Any failure, of a part or of the
// caller, aborts the upload: S3 makes the object visible only when the
// upload completes.
type s3Writer struct {
	s      *S3
	core   minio.Core
	ctx    context.Context
	cancel context.CancelFunc
	key    string
	opts   minio.PutObjectOptions

	buf      []byte // the part being filled, PartSize bytes; n of them written
	n        int
	spare    []byte // the other buffer, back from its part's upload
	uploadID string
	parts    []minio.CompletePart // uploaded, in order
	sending  chan partResult      // the part in flight; nil when none
	err      error                // what stopped the upload
	ended    bool                 // Close or Abort was called
}

type partResult struct {
	part minio.ObjectPart
	buf  []byte
	err  error
}

func (s *S3) unsignedWriter(ctx context.Context, key string) Writer {
	return s.newWriter(ctx, key, true)
}

func (s *S3) newWriter(ctx context.Context, key string, unsigned bool) *s3Writer {
	// One stall budget for the upload's every request, its abort included.
	ctx, cancel := context.WithCancel(withStallBudget(ctx))
	w := &s3Writer{s: s, core: minio.Core{Client: s.c}, ctx: ctx, cancel: cancel, key: key,
		opts: minio.PutObjectOptions{ContentType: "application/octet-stream", DisableContentSha256: unsigned}}
	if err := CheckKey(key); err != nil {
		w.err = err
	} else if err := s.ensureBucket(ctx); err != nil {
		w.err = err
	}
	return w
}

func (w *s3Writer) Write(b []byte) (int, error) {
	if w.ended {
		return 0, fmt.Errorf("write to %s after its put ended", w.key)
	}
	written := 0
	for len(b) > 0 && w.err == nil {
		if w.buf == nil {
			w.buf = w.s.pool.get()
		}
		c := copy(w.buf[w.n:], b)
		w.n += c
		written += c
		b = b[c:]
		if w.n == len(w.buf) {
			w.err = w.send()
		}
	}
	return written, w.err
}

// ReadFrom fills the part buffers straight from r, so that a put from a
// reader copies its bytes once. A read error is returned, not kept: the
// caller aborts.
func (w *s3Writer) ReadFrom(r io.Reader) (int64, error) {
	if w.ended {
		return 0, fmt.Errorf("write to %s after its put ended", w.key)
	}
	var total int64
	for w.err == nil {
		if w.buf == nil {
			w.buf = w.s.pool.get()
		}
		m, err := r.Read(w.buf[w.n:])
		w.n += m
		total += int64(m)
		if w.n == len(w.buf) {
			w.err = w.send()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return total, err
		}
	}
	return total, w.err
}

// send starts the upload of the full buffer as the next part, once the
// previous part is in, and takes the previous part's buffer to fill next.
func (w *s3Writer) send() error {
	if w.uploadID == "" {
		id, err := w.core.NewMultipartUpload(w.ctx, w.s.o.Bucket, w.key, w.opts)
		if err != nil {
			return w.s.wrap("start the multipart put of", w.key, err)
		}
		w.uploadID = id
	}
	if err := w.wait(); err != nil {
		return err
	}
	body, number := w.buf[:w.n], len(w.parts)+1
	w.buf, w.n, w.spare = w.spare, 0, nil
	done := make(chan partResult, 1)
	w.sending = done
	go func() {
		pb := newPartBody(body)
		part, err := w.core.PutObjectPart(w.ctx, w.s.o.Bucket, w.key, w.uploadID, number, pb, int64(len(body)),
			minio.PutObjectPartOptions{DisableContentSha256: w.opts.DisableContentSha256})
		pb.end()
		if err != nil {
			err = w.s.wrap(fmt.Sprintf("put part %d of", number), w.key, err)
		}
		done <- partResult{part: part, buf: body, err: err}
	}()
	return nil
}

// wait waits for the part in flight, if any, and keeps its buffer.
func (w *s3Writer) wait() error {
	if w.sending == nil {
		return nil
	}
	r := <-w.sending
	w.sending = nil
	w.spare = r.buf[:cap(r.buf)]
	if r.err != nil {
		return r.err
	}
	p := r.part
	w.parts = append(w.parts, minio.CompletePart{PartNumber: p.PartNumber, ETag: p.ETag,
		ChecksumCRC32: p.ChecksumCRC32, ChecksumCRC32C: p.ChecksumCRC32C, ChecksumSHA1: p.ChecksumSHA1,
		ChecksumSHA256: p.ChecksumSHA256, ChecksumCRC64NVME: p.ChecksumCRC64NVME})
	return nil
}

// Close completes the object: a single PUT when it fits in one part, else
// the last part and the multipart upload's completion.
func (w *s3Writer) Close() error {
	if w.ended {
		return fmt.Errorf("put of %s already ended", w.key)
	}
	w.ended = true
	defer w.release()
	if w.err == nil && w.uploadID == "" {
		body := newPartBody(w.buf[:w.n])
		_, err := w.core.PutObject(w.ctx, w.s.o.Bucket, w.key, body, int64(w.n), "", "", w.opts)
		body.end()
		return w.s.wrap("put", w.key, err)
	}
	if w.err == nil && w.n > 0 {
		w.err = w.send()
	}
	if w.err == nil {
		w.err = w.wait()
	}
	if w.err == nil {
		_, err := w.core.CompleteMultipartUpload(w.ctx, w.s.o.Bucket, w.key, w.uploadID, w.parts, w.opts)
		if err == nil {
			return nil
		}
		w.err = w.s.wrap("complete the multipart put of", w.key, err)
	}
	return withAbortErr(w.err, w.abort())
}

// Abort implements Writer.
func (w *s3Writer) Abort(cause error) error {
	if w.ended {
		return nil
	}
	w.ended = true
	defer w.release()
	return withAbortErr(w.err, w.abort())
}

// withAbortErr adds the failure to drop an unfinished upload to the error
// that stopped it, on one line, still wrapping the first.
func withAbortErr(err, aerr error) error {
	switch {
	case aerr == nil:
		return err
	case err == nil:
		return aerr
	}
	return fmt.Errorf("%w; dropping the unfinished upload failed too: %v", err, aerr)
}

// abort stops the part in flight and drops the multipart upload, if one
// was started.
func (w *s3Writer) abort() error {
	w.cancel()
	w.wait()
	if w.uploadID == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), abortTimeout)
	defer cancel()
	err := w.core.AbortMultipartUpload(ctx, w.s.o.Bucket, w.key, w.uploadID)
	return w.s.wrap("abort the multipart put of", w.key, err)
}

// release gives the part buffers back to the pool; no part is in flight.
func (w *s3Writer) release() {
	w.cancel()
	w.s.pool.put(w.buf)
	w.s.pool.put(w.spare)
	w.buf, w.spare = nil, nil
}

// partBody is a part's bytes as a request body that yields nothing once
// its request has returned: net/http may go on reading a body after a
// failed round trip returns, and the buffer goes back to the pool. It is
// seekable, so that minio-go retries the part.
type partBody struct {
	mu    sync.Mutex
	r     bytes.Reader
	ended bool
}

var errPartBodyEnded = errors.New("part body read after its request returned")

func newPartBody(b []byte) *partBody {
	pb := &partBody{}
	pb.r.Reset(b)
	return pb
}

func (pb *partBody) Read(p []byte) (int, error) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.ended {
		return 0, errPartBodyEnded
	}
	return pb.r.Read(p)
}

func (pb *partBody) Seek(offset int64, whence int) (int64, error) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.ended {
		return 0, errPartBodyEnded
	}
	return pb.r.Seek(offset, whence)
}

func (pb *partBody) end() {
	pb.mu.Lock()
	pb.ended = true
	pb.mu.Unlock()
}
