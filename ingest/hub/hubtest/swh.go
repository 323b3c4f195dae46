package hubtest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
)

// SWH is a local Software Heritage content bucket for tests: it serves
// each blob gzipped at /content/<blob id>, as the public S3 bucket does, and
// answers S3's NoSuchKey for a blob it does not hold.
type SWH struct {
	Server *httptest.Server

	mu    sync.Mutex
	blobs map[string][]byte
}

// NewSWH starts a Software Heritage bucket; Close it with Close.
func NewSWH() *SWH {
	s := &SWH{blobs: map[string][]byte{}}
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

func (s *SWH) serve(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/content/")
	s.mu.Lock()
	b, ok := s.blobs[id]
	s.mu.Unlock()
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
