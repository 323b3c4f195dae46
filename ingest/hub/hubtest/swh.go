package hubtest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// SWH is a local Software Heritage content bucket for tests: it serves
// each blob gzipped at /content/<blob id>, as the public S3 bucket does, and
// answers S3's NoSuchKey for a blob it does not hold. Set its fields
// before the first request and before Add, whose lock orders them before
// the server's reads: a request from a process the test starts orders
// nothing for the race detector. Once it may be serving, change it with
// its setters: SetFlaky, SetDown, SetPrivate, SetRegion, SetGate,
// SetBarrier.
type SWH struct {
	Server *httptest.Server

	// Flaky answers each blob's first request with 503 SlowDown, as S3
	// does under load.
	Flaky bool
	// Down answers every request with 503 SlowDown.
	Down bool
	// Private answers a request that carries no AWS signature with 403
	// AccessDenied, as the bucket does for anonymous readers.
	Private bool
	// Region, when set, is the bucket's region: a request signed for
	// another is answered 400 AuthorizationHeaderMalformed, as S3 does.
	Region string
	// Gate, when set, holds every request until it is closed.
	Gate chan struct{}
	// Barrier holds each request until this many are in flight at once,
	// or a second has passed: a test then reads Peak to know that a client
	// keeps that many requests outstanding.
	Barrier int64

	// mu guards the fields above once it may be serving (their setters),
	// and blobs and failed.
	mu       sync.Mutex
	blobs    map[string][]byte
	failed   map[string]bool
	inFlight atomic.Int64
	peak     atomic.Int64
}

// NewSWH starts a Software Heritage bucket; Close it with Close.
func NewSWH() *SWH {
	s := &SWH{blobs: map[string][]byte{}, failed: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Close stops the server.
func (s *SWH) Close() { s.Server.Close() }

// URL is the endpoint to give kiln (KILN_SWH_ENDPOINT).
func (s *SWH) URL() string { return s.Server.URL }

// Add stores content under blob id.
func (s *SWH) Add(id string, content []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blobs[id] = content
}

// SetFlaky makes the bucket answer each blob's first request with 503
// SlowDown (flaky), or stop, from the next request on.
func (s *SWH) SetFlaky(flaky bool) {
	s.mu.Lock()
	s.Flaky = flaky
	s.mu.Unlock()
}

// SetDown makes the bucket answer every request with 503 SlowDown (down),
// or serve again, from the next request on.
func (s *SWH) SetDown(down bool) {
	s.mu.Lock()
	s.Down = down
	s.mu.Unlock()
}

// SetPrivate makes the bucket refuse requests that carry no AWS signature
// with 403 AccessDenied (private), or take them again, from the next
// request on.
func (s *SWH) SetPrivate(private bool) {
	s.mu.Lock()
	s.Private = private
	s.mu.Unlock()
}

// SetRegion sets the bucket's region, "" for none, from the next request
// on: a request signed for another is answered 400
// AuthorizationHeaderMalformed.
func (s *SWH) SetRegion(region string) {
	s.mu.Lock()
	s.Region = region
	s.mu.Unlock()
}

// SetGate makes every request from the next on wait until gate is closed;
// nil takes the gate out. Requests already held wait for the gate they met.
func (s *SWH) SetGate(gate chan struct{}) {
	s.mu.Lock()
	s.Gate = gate
	s.mu.Unlock()
}

// SetBarrier makes every request from the next on wait until n are in
// flight at once, or a second has passed (Barrier).
func (s *SWH) SetBarrier(n int64) {
	s.mu.Lock()
	s.Barrier = n
	s.mu.Unlock()
}

// Peak is the most requests that were in flight at once.
func (s *SWH) Peak() int64 { return s.peak.Load() }

func (s *SWH) serve(w http.ResponseWriter, r *http.Request) {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	s.mu.Lock()
	gate, barrier := s.Gate, s.Barrier
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	for deadline := time.Now().Add(time.Second); s.peak.Load() < barrier && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	id, found := strings.CutPrefix(r.URL.Path, "/content/")
	if !found {
		// Another bucket, as S3 reads a path-style URL: an endpoint that
		// names the wrong one.
		bucket, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>%s</BucketName></Error>`, bucket)
		return
	}
	s.mu.Lock()
	b, ok := s.blobs[id]
	fail := s.Down || s.Flaky && !s.failed[id]
	s.failed[id] = true
	private, bucketRegion := s.Private, s.Region
	s.mu.Unlock()
	if private && !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>`)
		return
	}
	if region := signedRegion(r.Header.Get("Authorization")); bucketRegion != "" && region != "" && region != bucketRegion {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AuthorizationHeaderMalformed</Code><Message>The authorization header is malformed; the region '%s' is wrong; expecting '%s'</Message><Region>%s</Region></Error>`, region, bucketRegion, bucketRegion)
		return
	}
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code></Error>`)
		return
	}
	if !ok {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>content/%s</Key></Error>`, id)
		return
	}
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	z.Write(b)
	z.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Write(buf.Bytes())
}

// signedRegion is the region of a SigV4 Authorization header's credential
// scope (Credential=key/date/region/s3/aws4_request), or "".
func signedRegion(auth string) string {
	_, cred, ok := strings.Cut(auth, "Credential=")
	if !ok {
		return ""
	}
	cred, _, _ = strings.Cut(cred, ",")
	parts := strings.Split(cred, "/")
	if len(parts) < 5 {
		return ""
	}
	return parts[2]
}
