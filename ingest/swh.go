package ingest

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/klauspost/compress/gzip"
	"github.com/minio/minio-go/v7/pkg/signer"
	"go.uber.org/zap"
	"golang.org/x/text/encoding"
	"golang.org/x/text/encoding/htmlindex"
	"golang.org/x/text/encoding/ianaindex"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// DefaultSWHEndpoint is Software Heritage's public content bucket. Its terms
// for bulk download are the user's to accept.
const DefaultSWHEndpoint = "https://softwareheritage.s3.amazonaws.com"

// MaxBlobBytes bounds one blob after decompression; a larger one is skipped.
const MaxBlobBytes = 16 << 20

// SWH fetches file contents from Software Heritage's S3 bucket by blob id,
// for the datasets that ship ids only (the-stack-v2-dedup, python-edu).
type SWH struct {
	// Endpoint is the bucket's base URL (KILN_SWH_ENDPOINT); objects are
	// {Endpoint}/content/{blob_id}.
	Endpoint string
	// InFlight is the number of blobs requested at once (default 256): one
	// request takes tens of milliseconds and a blob is a few KiB, so latency,
	// not bandwidth, sets the rate.
	InFlight   int
	MaxRetries int // per blob, for 5xx, SlowDown and broken connections (default 5)
	HTTP       *http.Client
	// AWS credentials sign the requests (SigV4) when set; the bucket may
	// refuse anonymous requests.
	AccessKey, SecretKey, SessionToken, Region string
	Logger                                     *zap.Logger
}

// SWHFromEnv configures SWH from KILN_SWH_ENDPOINT and the AWS_* variables.
func SWHFromEnv() *SWH {
	s := &SWH{
		Endpoint:     os.Getenv("KILN_SWH_ENDPOINT"),
		AccessKey:    os.Getenv("AWS_ACCESS_KEY_ID"),
		SecretKey:    os.Getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken: os.Getenv("AWS_SESSION_TOKEN"),
		Region:       os.Getenv("AWS_REGION"),
	}
	return s
}

func (s *SWH) withDefaults() *SWH {
	c := *s
	c.Endpoint = strings.TrimRight(c.Endpoint, "/")
	if c.Endpoint == "" {
		c.Endpoint = DefaultSWHEndpoint
	}
	if c.InFlight <= 0 {
		c.InFlight = 256
	}
	if c.MaxRetries <= 0 {
		c.MaxRetries = 5
	}
	if c.HTTP == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = c.InFlight
		c.HTTP = &http.Client{Transport: t, Timeout: 2 * time.Minute}
	}
	if c.Region == "" {
		c.Region = "us-east-1"
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return &c
}

// Documents fetches the blob of each record of rows, InFlight at a time,
// and yields them in the order of rows so that a shard's content does not
// depend on network timing.
func (s *SWH) Documents(ctx context.Context, rows recordReader) Source {
	return s.documentsFrom(ctx, rows, 0)
}

// documentsFrom is Documents of the records of rows from record from on:
// the blobs of the records before it are not fetched.
func (s *SWH) documentsFrom(ctx context.Context, rows recordReader, from int64) Source {
	cfg := s.withDefaults()
	ctx, cancel := context.WithCancel(ctx)
	src := &swhSource{swh: cfg, rows: rows, from: from, cancel: cancel, skips: Skips{},
		queue: make(chan chan blobResult, cfg.InFlight), done: make(chan struct{})}
	go src.produce(ctx)
	return src
}

type blobResult struct {
	doc  Document
	skip string
	err  error
	// found: the blob was there (a document, or a blob skipped for its
	// content); bare: a 404 that is not S3's NoSuchKey (a plain web
	// server's).
	found, bare bool
	// at is the record's index in its file.
	at int64
}

type swhSource struct {
	swh    *SWH
	rows   recordReader
	from   int64 // the first record read
	log    skipLog
	cancel context.CancelFunc
	queue  chan chan blobResult
	done   chan struct{}
	skips  Skips
	failed error
	// Blobs found, and answered by a bare 404.
	found, bare int
}

// produce reads rows and starts a fetch for each, blocking while the queue
// (the window of requests in flight) is full.
func (s *swhSource) produce(ctx context.Context) {
	defer close(s.done)
	defer close(s.queue)
	for at := int64(0); ; at++ {
		rec, err := s.rows.next(ctx)
		if err == nil && at < s.from {
			continue
		}
		ch := make(chan blobResult, 1)
		select {
		case s.queue <- ch:
		case <-ctx.Done():
			return
		}
		if err != nil {
			ch <- blobResult{err: err}
			return
		}
		switch {
		case rec.skip != "":
			ch <- blobResult{skip: rec.skip, at: at}
		case rec.null:
			ch <- blobResult{skip: SkipEmptyDocument, at: at}
		default:
			go func() {
				r := s.swh.fetch(ctx, rec)
				r.at = at
				ch <- r
			}()
		}
	}
}

func (s *swhSource) Next(ctx context.Context) (Document, error) {
	if s.failed != nil {
		return Document{}, s.failed
	}
	for {
		var ch chan blobResult
		select {
		case ch = <-s.queue:
		case <-ctx.Done():
			return Document{}, ctx.Err()
		}
		if ch == nil {
			return Document{}, io.EOF
		}
		var r blobResult
		select {
		case r = <-ch:
		case <-ctx.Done():
			return Document{}, ctx.Err()
		}
		switch {
		case errors.Is(r.err, io.EOF) && s.found == 0 && s.bare > 0:
			// A mirror's address with a wrong path answers every blob
			// with a web server's 404: the file would be recorded as
			// empty, and kept out of the store after the address is
			// fixed.
			s.failed = &hub.BadInputError{Err: fmt.Errorf("Software Heritage (%s) answered each of this file's %d blobs with a bare 404 (not S3's NoSuchKey): check KILN_SWH_ENDPOINT, which must name the content bucket (unset, it is %s); the file is not recorded, and an ingest queued again reads it", s.swh.Endpoint, s.bare, DefaultSWHEndpoint)}
			return Document{}, s.failed
		case r.err != nil:
			s.failed = r.err
			return Document{}, r.err
		}
		if r.found {
			s.found++
		}
		if r.bare {
			s.bare++
		}
		switch {
		case r.skip != "":
			s.skips.Add(r.skip, 1)
			s.log.add(r.at, r.skip)
		default:
			return r.doc, nil
		}
	}
}

func (s *swhSource) Skipped() Skips       { return s.skips }
func (s *swhSource) SkippedAt() []SkipRun { return s.log }

func (s *swhSource) Close() error {
	s.cancel()
	for range s.queue { // let the producer see the cancellation and exit
	}
	<-s.done
	return s.rows.Close()
}

// fetch downloads, decompresses and decodes one blob.
func (s *SWH) fetch(ctx context.Context, rec record) blobResult {
	if !validBlobID(rec.blob) {
		return blobResult{skip: SkipMissingBlob}
	}
	var last error
	for attempt := 0; attempt <= s.MaxRetries; attempt++ {
		if attempt > 0 {
			d := time.Duration(100<<min(attempt, 6)) * time.Millisecond
			t := time.NewTimer(d/2 + rand.N(d/2+1))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return blobResult{err: ctx.Err()}
			}
		}
		body, status, err := s.get(ctx, rec.blob)
		switch {
		case ctx.Err() != nil:
			return blobResult{err: ctx.Err()}
		case err != nil:
			last = err
			continue
		case status == http.StatusOK:
			r := decodeBlob(rec, body)
			r.found = true
			return r
		case status == http.StatusNotFound && s3Code(body) != "" && s3Code(body) != "NoSuchKey":
			// NoSuchBucket and the like: no blob is there to find, and
			// skipping each as missing would record the file as empty.
			return blobResult{err: &hub.BadInputError{Err: fmt.Errorf("Software Heritage (%s) answered blob %s with 404 %s: check KILN_SWH_ENDPOINT, which must name the content bucket (unset, it is %s)", s.Endpoint, rec.blob, s3Code(body), DefaultSWHEndpoint)}}
		case status == http.StatusNotFound:
			// NoSuchKey (or a mirror's bare 404): the archive lacks this
			// blob; the rest of the shard is fine.
			return blobResult{skip: SkipMissingBlob, bare: s3Code(body) == ""}
		case status == http.StatusForbidden:
			// A refusal is the bucket's for every blob, and a retry of the
			// shard meets it again: it is the user's to fix, at once.
			return blobResult{err: &hub.BadInputError{Err: &SWHRefusedError{Endpoint: s.Endpoint, Blob: rec.blob, Code: s3Code(body), HasKeys: s.AccessKey != ""}}}
		case status == http.StatusBadRequest && s3Code(body) == "AuthorizationHeaderMalformed":
			// Signed for another region (AWS_REGION set for the machine's
			// own): every blob is refused alike.
			return blobResult{err: &hub.BadInputError{Err: fmt.Errorf("Software Heritage (%s) refused blob %s (400 AuthorizationHeaderMalformed): the requests are signed for region %s (AWS_REGION) and the bucket is in %q: set AWS_REGION to that, or unset it for Software Heritage's own bucket (us-east-1)", s.Endpoint, rec.blob, s.Region, s3Region(body))}}
		case status == http.StatusTooManyRequests || status >= 500:
			last = fmt.Errorf("%d %s", status, s3Code(body))
			continue
		default:
			return blobResult{err: fmt.Errorf("Software Heritage blob %s: unexpected answer %d %s", rec.blob, status, s3Code(body))}
		}
	}
	// The cause first: a listing cuts a reason to one short line.
	err := fmt.Errorf("Software Heritage (%s): %w (given up after %d attempts at blob %s)", s.Endpoint, last, s.MaxRetries+1, rec.blob)
	if errors.As(last, new(*net.OpError)) || errors.As(last, new(*net.DNSError)) {
		// No answer at all: the network, or the endpoint's name.
		err = fmt.Errorf("%w: %s is not reached from here; check this machine's network and proxy, or KILN_SWH_ENDPOINT (unset, it is %s)", err, s.Endpoint, DefaultSWHEndpoint)
	}
	return blobResult{err: err}
}

// SWHRefusedError is Software Heritage's 403 to a blob: the bucket refuses
// these credentials (none, or keys that may not read it) every blob alike.
type SWHRefusedError struct {
	Endpoint, Blob, Code string
	HasKeys              bool // AWS_ACCESS_KEY_ID was set
}

func (e *SWHRefusedError) Error() string {
	who := "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for an account that may read it"
	if e.HasKeys {
		who = "the account of AWS_ACCESS_KEY_ID may not read it: set the keys of one that may"
	}
	return fmt.Sprintf("Software Heritage (%s) refused blob %s (403 %s): its bulk-download terms are the user's to accept; %s, or KILN_SWH_ENDPOINT for a mirror", e.Endpoint, e.Blob, e.Code, who)
}

func (e *SWHRefusedError) BadInput() bool { return true }

func (s *SWH) get(ctx context.Context, blob string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint+"/content/"+blob, nil)
	if err != nil {
		return nil, 0, err
	}
	// Identity: the objects are gzip files, which we gunzip ourselves.
	req.Header.Set("Accept-Encoding", "identity")
	if s.AccessKey != "" {
		req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
		req = signer.SignV4(*req, s.AccessKey, s.SecretKey, s.SessionToken, s.Region)
	}
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBlobBytes+1))
	if err != nil {
		return nil, 0, err
	}
	return body, resp.StatusCode, nil
}

func decodeBlob(rec record, body []byte) blobResult {
	if len(body) > MaxBlobBytes {
		// Read up to one byte past the bound: a blob that large, gzipped
		// or not, is too large, not a gzip stream cut short.
		return blobResult{skip: SkipTooLarge}
	}
	if len(body) >= 2 && body[0] == 0x1f && body[1] == 0x8b {
		z, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return blobResult{skip: SkipCorruptFile}
		}
		body, err = io.ReadAll(io.LimitReader(z, MaxBlobBytes+1))
		if err != nil {
			return blobResult{skip: SkipCorruptFile}
		}
	}
	if len(body) > MaxBlobBytes {
		return blobResult{skip: SkipTooLarge}
	}
	enc, ok := lookupEncoding(rec.encoding)
	if !ok {
		return blobResult{skip: SkipUnknownEncoding}
	}
	if enc != nil {
		out, err := enc.NewDecoder().Bytes(body)
		if err != nil {
			return blobResult{skip: SkipInvalidUTF8}
		}
		body = out
	}
	if len(body) == 0 {
		return blobResult{skip: SkipEmptyDocument}
	}
	if !utf8.Valid(body) {
		return blobResult{skip: SkipInvalidUTF8}
	}
	return blobResult{doc: Document{ID: rec.id, Text: string(body)}}
}

// lookupEncoding maps a src_encoding to a decoder; nil means UTF-8 as is.
func lookupEncoding(name string) (encoding.Encoding, bool) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "utf-8", "utf8", "ascii", "us-ascii":
		return nil, true
	}
	if e, err := ianaindex.IANA.Encoding(name); err == nil && e != nil {
		return e, true
	}
	if e, err := htmlindex.Get(name); err == nil && e != nil {
		return e, true
	}
	return nil, false
}

func validBlobID(id string) bool {
	if len(id) != 40 {
		return false
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// s3Region extracts <Region> from an S3 error document: the bucket's region.
func s3Region(body []byte) string {
	var e struct {
		Region string `xml:"Region"`
	}
	if xml.Unmarshal(body, &e) == nil {
		return e.Region
	}
	return ""
}

// s3Code extracts <Code> from an S3 error document.
func s3Code(body []byte) string {
	var e struct {
		Code string `xml:"Code"`
	}
	if xml.Unmarshal(body, &e) == nil {
		return e.Code
	}
	return ""
}
