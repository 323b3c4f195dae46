package testsvc

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FaultAction is what an S3Faults rule does to a request it matches.
type FaultAction int

const (
	// Flip passes the answer on with one bit of its body changed (at the
	// rule's At, or the body's middle when At is negative): a corruption in
	// transit that a length check does not see.
	Flip FaultAction = iota
	// Truncate sends the answer's headers, its Content-Length whole, and
	// half its body, then closes the connection.
	Truncate
	// Status answers with the rule's Code and an S3 XML error (SlowDown for
	// 503, InternalError otherwise), without passing the request on.
	Status
	// Hold passes the request on only once the rule's Release channel is
	// closed (or the request's client goes away): a store slow to answer,
	// for as long as the test says.
	Hold
	// HoldAnswer passes the request on at once and holds its answer until
	// the rule's Release channel is closed: the server has done what was
	// asked (an object is stored) and its client does not know it yet, the
	// window in which a client killed leaves what it never learnt of. When
	// the client goes away first, the answer is dropped.
	HoldAnswer
)

// Fault is one rule of an S3Faults proxy: the requests it matches and what
// it does to them.
type Fault struct {
	// Method ("GET", "PUT", ...) the request must have; any when empty.
	Method string
	// Path is a substring of the request's path (bucket/key) it must hold;
	// Query a substring of its raw query. Any when empty.
	Path, Query string
	Action      FaultAction
	// Count is how many requests the rule acts on before it is spent; every
	// matching request while it is 0.
	Count int
	// At is the body offset a Flip changes; the middle when negative.
	At int64
	// Code is a Status rule's HTTP status.
	Code int
	// Release, closed by the test, lets a Hold rule's requests through,
	// and a HoldAnswer rule's answers.
	Release chan struct{}
	// Held, closed by the proxy, says that a Hold rule holds its first
	// request, or a HoldAnswer rule its first answer (the server has done
	// the request): the event a test waits for to act in that window.
	Held chan struct{}

	hits int
	held bool // Held is closed
}

// S3Faults is a reverse proxy in front of a real S3 server (versitygw) that
// alters the answers its rules match and passes every other request on as
// it is: the faults a real store, a throttling service or a middlebox gives,
// on demand.
type S3Faults struct {
	// Endpoint is the proxy's host:port, used in place of the server's.
	Endpoint string

	mu    sync.Mutex
	rules []*Fault
	acted map[string]int // "METHOD path" of each request a rule acted on, counted
}

// Faults starts a proxy in front of s, closed when the test ends. Signed
// requests pass through unchanged: the proxy keeps the Host header, which
// the signature covers.
func (s *S3Server) Faults(t testing.TB) *S3Faults {
	t.Helper()
	target, err := url.Parse(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	f := &S3Faults{acted: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Director = func(r *http.Request) {
		r.URL.Scheme, r.URL.Host = target.Scheme, target.Host
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rule := f.match(r)
		if rule == nil {
			rp.ServeHTTP(w, r)
			return
		}
		switch rule.Action {
		case Status:
			code := "InternalError"
			if rule.Code == http.StatusServiceUnavailable {
				code = "SlowDown"
			}
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(rule.Code)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by the test</Message><Resource>%s</Resource><RequestId>fault</RequestId></Error>`, code, r.URL.Path)
		case Hold:
			f.holding(rule)
			select {
			case <-rule.Release:
			case <-r.Context().Done():
				return
			}
			rp.ServeHTTP(w, r)
		case HoldAnswer:
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			f.holding(rule)
			select {
			case <-rule.Release:
			case <-r.Context().Done():
				return
			}
			copyAnswer(w, rec.Result().Header, rec.Code, rec.Body.Bytes())
		case Flip, Truncate:
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			if rec.Code/100 != 2 || len(body) == 0 {
				copyAnswer(w, rec.Result().Header, rec.Code, body)
				return
			}
			if rule.Action == Flip {
				at := rule.At
				if at < 0 || at >= int64(len(body)) {
					at = int64(len(body)) / 2
				}
				body = bytes.Clone(body)
				body[at] ^= 0x01
				copyAnswer(w, rec.Result().Header, rec.Code, body)
				return
			}
			truncate(w, rec, body)
		}
	}))
	t.Cleanup(func() {
		f.Clear()
		srv.Close()
	})
	f.Endpoint = strings.TrimPrefix(srv.URL, "http://")
	return f
}

// Add puts rule in force, after those already added; the first rule that
// matches a request acts on it. A Hold or HoldAnswer rule without a
// Release gets one, which Clear or the test's end closes, and one without
// a Held gets one.
func (f *S3Faults) Add(rule Fault) *Fault {
	r := rule
	if r.holds() {
		if r.Release == nil {
			r.Release = make(chan struct{})
		}
		if r.Held == nil {
			r.Held = make(chan struct{})
		}
	}
	f.mu.Lock()
	f.rules = append(f.rules, &r)
	f.mu.Unlock()
	return &r
}

// Clear takes every rule out of force and lets held requests and answers
// through.
func (f *S3Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.holds() {
			select {
			case <-r.Release:
			default:
				close(r.Release)
			}
		}
	}
	f.rules = nil
}

// Acted is how many requests whose "METHOD path" holds match a rule acted
// on.
func (f *S3Faults) Acted(match string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, c := range f.acted {
		if strings.Contains(k, match) {
			n += c
		}
	}
	return n
}

func (r *Fault) holds() bool { return r.Action == Hold || r.Action == HoldAnswer }

// holding closes rule's Held, the first time it holds a request or an
// answer.
func (f *S3Faults) holding(rule *Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !rule.held {
		rule.held = true
		close(rule.Held)
	}
}

func (f *S3Faults) match(r *http.Request) *Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rule := range f.rules {
		if rule.Count > 0 && rule.hits >= rule.Count {
			continue
		}
		if rule.Method != "" && rule.Method != r.Method || !strings.Contains(r.URL.Path, rule.Path) || !strings.Contains(r.URL.RawQuery, rule.Query) {
			continue
		}
		rule.hits++
		f.acted[r.Method+" "+r.URL.Path]++
		return rule
	}
	return nil
}

func copyAnswer(w http.ResponseWriter, h http.Header, code int, body []byte) {
	for k, v := range h {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	w.Write(body)
}

// truncate writes the answer's status line, headers and the first half of
// body on the raw connection, its Content-Length saying the whole, and
// closes it.
func truncate(w http.ResponseWriter, rec *httptest.ResponseRecorder, body []byte) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err) // httptest's server always hijacks
	}
	defer conn.Close()
	writeHead(buf, rec, len(body))
	buf.Write(body[:len(body)/2])
	buf.Flush()
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

func writeHead(buf *bufio.ReadWriter, rec *httptest.ResponseRecorder, n int) {
	fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", rec.Code, http.StatusText(rec.Code))
	h := rec.Result().Header.Clone()
	h.Set("Content-Length", strconv.Itoa(n))
	h.Set("Connection", "close")
	h.Write(buf)
	io.WriteString(buf, "\r\n")
}
