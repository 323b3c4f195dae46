package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/kiln-lm/kiln/internal/redact"
)

// S3Options configures an S3 store. Zero values take the defaults noted.
type S3Options struct {
	// Endpoint is host:port, without scheme.
	Endpoint  string
	Bucket    string
	AccessKey string
	SecretKey string
	// Secure selects https.
	Secure bool
	// PartSize is the multipart part size: a put of unknown size fills one
	// part while the previous one uploads, so two of these bound its
	// memory. Default 16 MiB (S3's minimum is 5 MiB).
	PartSize uint64
	// MaxRetries is how many times minio-go sends one request (the first
	// time included) that meets a transient error: a refused or dropped
	// connection, a 5xx status, throttling (503 SlowDown). Between tries it
	// waits a random time up to 200 ms, the bound doubling each try up to a
	// second: the default's five tries wait up to 2.4 s in all (half that
	// on average), which outlasts a short burst of throttling; a longer
	// outage is the caller's to wait out. A put's body is sent again from
	// its reader where that can seek (bytes.Reader, os.File), else from
	// memory or from the buffers of its parts (putBody). A download cut
	// off mid-body asks for its rest, up to MaxRetries-1 times (s3Body).
	// A request that stalls (StallTimeout) is tried twice at most. Default
	// 5.
	MaxRetries int
	// StallTimeout bounds how long a request may go without progress: no
	// byte sent or received, the wait for the server's answer after the
	// body included. A server that hangs (a stopped process, a network
	// path that drops packets without a reset) would otherwise hold the
	// request, and the caller, forever; after it the request fails and is
	// tried once more, and a second stall gives up on the store for the
	// rest of the operation (stallBudget): its other requests, and the
	// rest of a download, fail at once. A store that takes connections and
	// never answers so holds an operation twice StallTimeout (4 minutes at
	// the default), not once per try (10). A slow transfer that keeps
	// moving is never cut, however long it takes in all, so it is no bound
	// on a whole request. Default 2 minutes, above minio-go's own wait for
	// an answer (1 minute, which it replaces) as servers may take a while
	// to assemble a large multipart object.
	StallTimeout time.Duration
}

// DefaultStallTimeout is S3Options.StallTimeout's default.
const DefaultStallTimeout = 2 * time.Minute

// DefaultPartSize is the multipart part size of S3 puts.
const DefaultPartSize = 16 << 20

// S3 stores objects in one bucket of an S3 server.
type S3 struct {
	o      S3Options
	c      *minio.Client
	pool   *partPool // part buffers of puts of unknown size
	mu     sync.Mutex
	bucket bool // bucket known to exist
}

// NewS3 returns an S3 store. It does not contact the server; the bucket is
// created on the first put.
func NewS3(o S3Options) (*S3, error) {
	if o.PartSize == 0 {
		o.PartSize = DefaultPartSize
	}
	if o.PartSize < 5<<20 {
		return nil, fmt.Errorf("s3 part size %d is below S3's 5 MiB minimum", o.PartSize)
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = 5
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	tr, err := o.transport()
	if err != nil {
		return nil, &S3Error{Op: "connect", Store: o.url(), Err: err, bad: true}
	}
	c, err := minio.New(o.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(o.AccessKey, o.SecretKey, ""),
		Secure:     o.Secure,
		MaxRetries: o.MaxRetries,
		Transport:  tr,
	})
	if err != nil {
		return nil, &S3Error{Op: "connect", Store: o.url(), Err: err, bad: true}
	}
	return &S3{o: o, c: c, pool: &partPool{size: int(o.PartSize), idle: make(chan []byte, idleParts)}}, nil
}

// String is the store's URL, scheme://endpoint/bucket, for messages that
// name where objects go.
func (s *S3) String() string { return s.o.url() }

func (o S3Options) url() string {
	scheme := "http"
	if o.Secure {
		scheme = "https"
	}
	u := scheme + "://" + o.Endpoint + "/" + o.Bucket
	// An endpoint written with credentials in it (user:pass@host) would
	// otherwise print them in every error.
	return redact.URL(u)
}

// S3Error names the operation, the endpoint and the object.
type S3Error struct {
	Op string
	// Store is the bucket's URL, scheme://endpoint/bucket, and Key the
	// object ("" for the bucket).
	Store, Key string
	Err        error
	bad        bool
	// refused is the server's code where it refused the keys ("" where
	// it did not; bad is set too).
	refused string
	// status is the server's HTTP status, 0 when none came back (the
	// connection failed or stalled).
	status int
}

func (e *S3Error) Error() string {
	u := e.Store
	if e.Key != "" {
		u += "/" + e.Key
	}
	return fmt.Sprintf("s3 %s %s: %v", e.Op, u, e.Err)
}
func (e *S3Error) Unwrap() error { return e.Err }

// BadInput is true for errors only the user can fix: wrong credentials or
// a malformed endpoint.
func (e *S3Error) BadInput() bool { return e.bad }

func (s *S3) wrap(op, key string, err error) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchKey", "NoSuchBucket":
		err = fmt.Errorf("%w (%s)", ErrNotFound, resp.Code)
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidSecretKey",
		// versitygw's answer to an access key it does not know, a 404.
		"XAdminUserNotFound":
		return &S3Error{Op: op, Store: s.o.url(), Key: key, bad: true, refused: resp.Code,
			Err: fmt.Errorf("%s: check KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY", resp.Code)}
	}
	if resp.StatusCode == http.StatusNotFound && !errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	if resp.StatusCode != 0 && !errors.Is(err, ErrNotFound) {
		err = answerError{resp}
	}
	return &S3Error{Op: op, Store: s.o.url(), Key: key, Err: err, status: resp.StatusCode}
}

// answerError is the server's error answer as a message names it: its
// status, its code and its message ("503 SlowDown: Please reduce your
// request rate"), where minio-go's error reads as the message alone, which
// does not say that the store answered, nor what.
type answerError struct{ resp minio.ErrorResponse }

func (e answerError) Error() string {
	status := strconv.Itoa(e.resp.StatusCode)
	code := e.resp.Code
	switch {
	case code == "":
		code = status + " " + http.StatusText(e.resp.StatusCode)
	case !strings.HasPrefix(code, status):
		// Without an S3 error in its body, the code is the status line
		// ("503 Service Unavailable").
		code = status + " " + code
	}
	if m := e.resp.Message; m != "" && m != e.resp.Code {
		return code + ": " + m
	}
	return code
}

func (e answerError) Unwrap() error { return e.resp }

// Outage says in a few words what an Unreachable err is: the operation
// and its innermost cause ("list: connect: connection refused", "get: 503
// Service Unavailable"), where the whole error repeats the request's URL.
func Outage(err error) string {
	var se *S3Error
	if !errors.As(err, &se) {
		return err.Error()
	}
	cause := se.Err
	var op *net.OpError
	var ue *url.Error
	switch {
	case errors.As(cause, &op):
		cause = op.Err
	case errors.As(cause, &ue):
		cause = ue.Err
	}
	return se.Op + ": " + cause.Error()
}

// Unreachable reports whether err is an object store that did not answer
// (refused or dropped connections, a request that stalled) or answered
// that it is failing (a 5xx status): an outage, which ends when the server
// is back, unlike wrong credentials, a missing object or a cancelled call.
// KeysRefused is the object store's code (SignatureDoesNotMatch, say)
// where err is its refusal of the keys it was asked with (wrong, rotated or
// revoked): the configuration's to mend, not the request's. "" otherwise.
func KeysRefused(err error) string {
	var se *S3Error
	if errors.As(err, &se) {
		return se.refused
	}
	return ""
}

func Unreachable(err error) bool {
	var se *S3Error
	if !errors.As(err, &se) || se.bad || errors.Is(err, ErrNotFound) || errors.Is(err, context.Canceled) {
		return false
	}
	return se.status == 0 || se.status >= 500
}

// ensureBucket creates the bucket on first use.
func (s *S3) ensureBucket(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bucket {
		return nil
	}
	ok, err := s.bucketExists(ctx, "check bucket")
	if err != nil {
		return err
	}
	if !ok {
		err := s.c.MakeBucket(ctx, s.o.Bucket, minio.MakeBucketOptions{})
		if code := minio.ToErrorResponse(err).Code; err != nil && code != "BucketAlreadyOwnedByYou" && code != "BucketAlreadyExists" {
			return s.wrap("create bucket", "", err)
		}
	}
	s.bucket = true
	return nil
}

// Put implements Store. S3 makes a put visible only when it completes (a
// single PUT, or the completion of a multipart upload), so readers never
// see part of an object; a failed multipart upload is aborted.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, key, r, size, false)
}

// PutUnsigned is Put without a signature over the body: each request is
// still signed, but its payload goes as UNSIGNED-PAYLOAD. Over plain http
// minio-go otherwise signs every 64 KiB chunk (a SHA-256 of every byte)
// and the server verifies each one; that protects only the transfer, which
// a caller that checks the object's own hash on read covers already.
func (s *S3) PutUnsigned(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, key, r, size, true)
}

func (s *S3) put(ctx context.Context, key string, r io.Reader, size int64, unsigned bool) error {
	ctx = withStallBudget(ctx)
	if size < 0 {
		return s.putStream(ctx, key, r, unsigned)
	}
	if err := CheckKey(key); err != nil {
		return err
	}
	if err := s.ensureBucket(ctx); err != nil {
		return err
	}
	body, err := putBody(ctx, r, size, s.o.PartSize)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	opts := minio.PutObjectOptions{PartSize: s.o.PartSize, ContentType: "application/octet-stream", DisableContentSha256: unsigned}
	_, err = s.c.PutObject(ctx, s.o.Bucket, key, body, size, opts)
	return s.wrap("put", key, err)
}

// putBody is the body of a put of known size, read until ctx ends, that
// minio-go can send again after a transient failure (a 503 SlowDown): it
// retries a request only when it can rewind the body, which it does by
// seeking to 0. A reader that can seek keeps Seek, relative to where the
// put found it. One that cannot (a reader that hashes what it passes on)
// and fits one part is read into memory first; a larger one goes in
// parts, which minio-go reads into buffers of its own.
func putBody(ctx context.Context, r io.Reader, size int64, partSize uint64) (io.Reader, error) {
	if rs, ok := r.(io.ReadSeeker); ok {
		// A pipe or a terminal as an *os.File cannot seek after all.
		if start, err := rs.Seek(0, io.SeekCurrent); err == nil {
			return &ctxReadSeeker{ctxReader: ctxReader{ctx, r}, s: rs, start: start}, nil
		}
	}
	if size > int64(partSize) {
		return ctxReader{ctx, r}, nil
	}
	// One byte more than the size, whose arrival refuses a body longer
	// than it says, as a request's length does.
	b := make([]byte, size+1)
	n, err := io.ReadFull(ctxReader{ctx, r}, b)
	switch {
	case err == nil:
		return nil, fmt.Errorf("its body holds more than its %d bytes", size)
	case err != io.EOF && err != io.ErrUnexpectedEOF:
		return nil, fmt.Errorf("reading its body: %w", err)
	case int64(n) < size:
		return nil, fmt.Errorf("its body ended after %d of its %d bytes", n, size)
	}
	return bytes.NewReader(b[:size]), nil
}

// ctxReadSeeker is a ctxReader that seeks within the body from start on.
type ctxReadSeeker struct {
	ctxReader
	s     io.Seeker
	start int64
}

func (c *ctxReadSeeker) Seek(offset int64, whence int) (int64, error) {
	if whence == io.SeekStart {
		offset += c.start
	}
	at, err := c.s.Seek(offset, whence)
	return at - c.start, err
}

// putStream puts a reader of unknown size through the store's streaming
// writer, which checks the key and the bucket itself.
func (s *S3) putStream(ctx context.Context, key string, r io.Reader, unsigned bool) error {
	w := s.newWriter(ctx, key, unsigned)
	if _, err := io.Copy(w, ctxReader{ctx, r}); err != nil {
		if aerr := w.Abort(err); aerr != nil {
			return aerr
		}
		return s.wrap("put", key, err)
	}
	return w.Close()
}

// Get implements Store. A read of the body that fails returns an *S3Error
// as every other request does (s3Body); one whose connection drops
// mid-body goes on from where it stopped, as other requests are tried
// again.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	// One budget for the stat, the GET and the GETs of the body's rest.
	ctx = withStallBudget(ctx)
	// minio-go's GetObject is lazy; Stat first so that a missing object is
	// reported here rather than on the first Read.
	oi, err := s.stat(ctx, key)
	if err != nil {
		return nil, err
	}
	b := &s3Body{s: s, ctx: ctx, key: key, etag: oi.ETag}
	if err := b.open(); err != nil {
		return nil, err
	}
	return b, nil
}

// s3Body is an object's body whose read errors name the store, the object
// and the server's answer, and are classed as every request's are:
// minio-go's reader, which sends the GET at the first read, returns them
// bare. A read that fails as the store not answering (a connection
// dropped mid-body, a 5xx) is taken up again from the byte it stopped at,
// by a GET of the rest of the same object (its ETag, so that an object
// replaced meanwhile fails rather than splice two), up to MaxRetries-1
// times in one body: minio-go tries a request again, but not a body cut
// off once its answer began. A body that stopped coming (StallTimeout)
// counts as a stall of its GET: a stalled GET is asked for again once, and
// after a second stall the body gives up (stallBudget). Where that is not
// enough the error stays (io.ErrUnexpectedEOF for a cut), classed as the
// store not answering: a body cut short is never taken for a whole one. An
// object replaced between the stat and the GET's answer, before a byte of
// it was read, is stated and asked for again (replaced), up to
// MaxRetries-1 times.
type s3Body struct {
	s    *S3
	ctx  context.Context
	key  string
	etag string
	o    *minio.Object
	// off is how many bytes of the object were read; resumed, how many
	// times the rest of it was asked for; restated, how many times it was
	// found replaced before its first byte and asked for again.
	off      int64
	resumed  int
	restated int
}

// replaced reports whether err is the store's answer to a GET of an object
// whose ETag is no longer the one asked for (412 PreconditionFailed).
func replaced(err error) bool {
	var e *S3Error
	return errors.As(err, &e) && e.status == http.StatusPreconditionFailed
}

// open sends the GET of the object from off.
func (b *s3Body) open() error {
	var opts minio.GetObjectOptions
	if b.etag != "" {
		if err := opts.SetMatchETag(b.etag); err != nil {
			return err
		}
	}
	if b.off > 0 {
		if err := opts.SetRange(b.off, 0); err != nil {
			return err
		}
	}
	o, err := b.s.c.GetObject(b.ctx, b.s.o.Bucket, b.key, opts)
	if err != nil {
		return b.s.wrap("get", b.key, err)
	}
	b.o = o
	return nil
}

func (b *s3Body) Read(p []byte) (int, error) {
	for {
		n, err := b.o.Read(p)
		b.off += int64(n)
		if err == nil || err == io.EOF {
			return n, err
		}
		err = b.s.wrap("get", b.key, err)
		if n > 0 {
			// The bytes first; the next read meets the error again.
			return n, nil
		}
		var stalled *stalledError
		if b.off == 0 && replaced(err) && b.restated < b.s.o.MaxRetries-1 && b.ctx.Err() == nil {
			// Replaced between its stat and its GET, before a byte of it
			// was read: the new object is read whole, as a Get sent a
			// moment later would. An object rewritten in place (a store's
			// status.json, written at every append) is read while it
			// changes, and this is no fault of the store's.
			b.restated++
			b.o.Close()
			oi, serr := b.s.stat(b.ctx, b.key)
			if serr != nil {
				return 0, serr
			}
			b.etag = oi.ETag
			if oerr := b.open(); oerr != nil {
				return 0, oerr
			}
			continue
		}
		if !Unreachable(err) || b.ctx.Err() != nil || b.resumed >= b.s.o.MaxRetries-1 || errors.As(err, &stalled) {
			return 0, err
		}
		b.resumed++
		b.o.Close()
		if oerr := b.open(); oerr != nil {
			return 0, oerr
		}
	}
}

func (b *s3Body) Close() error { return b.o.Close() }

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := CheckKey(key); err != nil {
		return Info{}, err
	}
	ctx = withStallBudget(ctx)
	oi, err := s.stat(ctx, key)
	if err != nil {
		return Info{}, err
	}
	return Info{Key: oi.Key, Size: oi.Size, Modified: oi.LastModified}, nil
}

// stat is StatObject, a HEAD, whose 404 is confirmed (confirmMissing)
// before it is reported as the object missing.
func (s *S3) stat(ctx context.Context, key string) (minio.ObjectInfo, error) {
	oi, err := s.c.StatObject(ctx, s.o.Bucket, key, minio.StatObjectOptions{})
	if err == nil {
		return oi, nil
	}
	if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
		if cerr := s.confirmMissing(ctx, "stat", key); cerr != nil {
			return oi, cerr
		}
	}
	return oi, s.wrap("stat", key, err)
}

// bucketExists is BucketExists, a HEAD, whose "no bucket" (its 404) is
// confirmed (confirmMissing).
func (s *S3) bucketExists(ctx context.Context, op string) (bool, error) {
	ok, err := s.c.BucketExists(ctx, s.o.Bucket)
	if err != nil {
		return false, s.wrap(op, "", err)
	}
	if !ok {
		if cerr := s.confirmMissing(ctx, op, ""); cerr != nil {
			return false, cerr
		}
	}
	return ok, nil
}

// confirmMissing asks the store, after a HEAD of key (the bucket where key
// is "") was answered 404, whether it takes this store's keys at all: nil
// where it does, and the 404 stands; the error of op otherwise. A HEAD's
// answer has no body to name its code, and versitygw answers a request
// signed with an access key it does not know (keys rotated or revoked) with
// a 404 whose code (XAdminUserNotFound) only a body carries: minio-go reads
// that bare 404 as NoSuchKey, or as no bucket. A listing of one key from
// key on is answered with a body, so its error is classed as every other
// request's: the keys refused, the store not answering. Real S3 and MinIO
// answer a HEAD with refused keys 403, classed without this; an object
// found costs no listing.
func (s *S3) confirmMissing(ctx context.Context, op, key string) error {
	noOwner := false
	for oi := range s.c.ListObjectsIter(ctx, s.o.Bucket, minio.ListObjectsOptions{Prefix: key, Recursive: true, MaxKeys: 1, FetchOwner: &noOwner}) {
		if oi.Err == nil {
			break
		}
		err := s.wrap(op, key, oi.Err)
		if errors.Is(err, ErrNotFound) {
			// No bucket, with keys the store takes.
			return nil
		}
		return err
	}
	// None where the listing is empty, or where ctx ended before it was
	// sent.
	return s.wrap(op, key, ctx.Err())
}

// List implements Store. A bucket that does not exist yet lists empty.
func (s *S3) List(ctx context.Context, prefix string) ([]Info, error) {
	ctx = withStallBudget(ctx)
	var out []Info
	for oi := range s.c.ListObjects(ctx, s.o.Bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if oi.Err != nil {
			if minio.ToErrorResponse(oi.Err).Code == "NoSuchBucket" {
				return nil, nil
			}
			return nil, s.wrap("list", prefix+"*", oi.Err)
		}
		out = append(out, Info{Key: oi.Key, Size: oi.Size, Modified: oi.LastModified})
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Delete implements Store.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	ctx = withStallBudget(ctx)
	err := s.c.RemoveObject(ctx, s.o.Bucket, key, minio.RemoveObjectOptions{})
	if code := minio.ToErrorResponse(err).Code; code == "NoSuchKey" || code == "NoSuchBucket" {
		return nil
	}
	return s.wrap("delete", key, err)
}

// Check verifies that the server answers and accepts the credentials, and
// says whether the bucket exists. A missing bucket is no error: the first
// put creates it, as a fresh setup needs. But a mistyped bucket name is
// created the same way, so a caller that checks the configuration should
// say that it is missing.
func (s *S3) Check(ctx context.Context) (bucket bool, err error) {
	ctx = withStallBudget(ctx)
	ok, err := s.bucketExists(ctx, "check")
	if err != nil {
		return false, err
	}
	if ok {
		s.mu.Lock()
		s.bucket = true
		s.mu.Unlock()
	}
	return ok, nil
}
