package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// stallProxy forwards TCP connections to a real server. Frozen, it stops
// forwarding in both directions and keeps every connection open, as a
// server process that is stopped does (its kernel still accepts and
// buffers); paced, it forwards what the server sends a piece at a time.
type stallProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	gate   chan struct{} // non-nil while frozen; closed to thaw
	pace   time.Duration // between the pieces forwarded from the server
	conns  []net.Conn
	closed chan struct{}
	// accepted counts the connections the proxy took from its clients.
	accepted atomic.Int64
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, closed: make(chan struct{})}
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.track(c)
		go func() {
			p.wait()
			s, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.track(s)
			go p.pipe(s, c, false)
			p.pipe(c, s, true)
		}()
	}
}

func (p *stallProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns = append(p.conns, c)
}

// pipe copies src to dst until either ends, then closes both.
func (p *stallProxy) pipe(dst, src net.Conn, fromServer bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			p.mu.Lock()
			pace := p.pace
			p.mu.Unlock()
			if fromServer && pace > 0 {
				time.Sleep(pace)
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait blocks while the proxy is frozen.
func (p *stallProxy) wait() {
	p.mu.Lock()
	g := p.gate
	p.mu.Unlock()
	if g == nil {
		return
	}
	select {
	case <-g:
	case <-p.closed:
	}
}

func (p *stallProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate == nil {
		p.gate = make(chan struct{})
	}
}

func (p *stallProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
}

func (p *stallProxy) setPace(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pace = d
}

func (p *stallProxy) close() {
	close(p.closed)
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// within runs op and fails the test if it has not returned after a
// minute: far beyond the stall timeouts these tests set, so only an op
// that would block forever reaches it.
func within(t *testing.T, what string, op func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- op() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s still blocked after a minute: a hung server must fail it after StallTimeout", what)
		return nil
	}
}

// A server that stops answering (its process stopped, seen through a
// proxy that stops forwarding) fails each kind of request after
// StallTimeout instead of holding it forever: a put waiting for its answer,
// a put whose body no longer goes out, and a get whose body stopped coming;
// once the server answers again, so does the store.
func TestS3HungServerFailsAfterStallTimeout(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	proxy := newStallProxy(t, srv.Endpoint)
	s, err := NewS3(S3Options{Endpoint: proxy.addr(), Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
		PartSize: 64 << 20, MaxRetries: 1, StallTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := make([]byte, 32<<20) // more than loopback's socket buffers hold
	rand.Read(body)
	if err := s.Put(ctx, "results/r/big", bytes.NewReader(body[:8<<20]), 8<<20); err != nil {
		t.Fatal(err)
	}

	proxy.freeze()
	for _, c := range []struct {
		what string
		op   func() error
	}{
		{"a small put", func() error { return s.Put(ctx, "results/r/small", strings.NewReader("x"), 1) }},
		{"a 32 MiB put", func() error { return s.Put(ctx, "results/r/huge", bytes.NewReader(body), int64(len(body))) }},
	} {
		err := within(t, c.what, c.op)
		// The error is the timeout, or the connection it closed when the
		// transport's read of the answer timed out first.
		if err == nil || !strings.Contains(err.Error(), proxy.addr()) {
			t.Errorf("%s to a hung server: %v; want an error naming the endpoint %s", c.what, err, proxy.addr())
		}
	}
	proxy.thaw()

	// The get's body stops once its first bytes are read: paced, most of
	// it is still on its way when the proxy freezes.
	proxy.setPace(10 * time.Millisecond)
	r, err := s.Get(ctx, "results/r/big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	proxy.freeze()
	var n int64
	err = within(t, "a get's body", func() error {
		var err error
		n, err = io.Copy(io.Discard, r)
		return err
	})
	r.Close()
	if err == nil || n+1024 >= 8<<20 {
		t.Errorf("get of a body the server stopped sending: read %d more bytes, %v; want a timeout", n, err)
	}
	proxy.thaw()
	proxy.setPace(0)
	if err := s.Put(ctx, "results/r/after", strings.NewReader("x"), 1); err != nil {
		t.Fatalf("put once the server answers again: %v", err)
	}
}

// StallTimeout bounds the time without progress, not a whole request: a
// get that takes several times the timeout in all, its body coming a piece
// at a time, reads whole.
func TestS3SlowTransferOutlastsStallTimeout(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	proxy := newStallProxy(t, srv.Endpoint)
	const stall = time.Second
	s, err := NewS3(S3Options{Endpoint: proxy.addr(), Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := make([]byte, 3<<20)
	rand.Read(body)
	if err := s.Put(ctx, "results/r/slow", bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	// 96 pieces of 32 KiB, 20 ms apart: about 2 s in all, a fiftieth of
	// the timeout between pieces.
	proxy.setPace(20 * time.Millisecond)
	start := time.Now()
	r, err := s.Get(ctx, "results/r/slow")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("slow get: %d of %d bytes, %v", len(got), len(body), err)
	}
	t.Logf("the get took %v, StallTimeout %v", time.Since(start).Round(time.Millisecond), stall)
}

// A store that takes every request and never answers (a hung MinIO, a
// stuck load balancer) is given up on at a request's second stall, not at
// its fifth try: 4 minutes at the default StallTimeout, not 10. A put, a
// get whose stat is held and a get whose GET is held (its body asks for
// it again) each send their request twice, and fail as the store not
// answering, saying that it stalled.
func TestS3HungStoreIsTriedTwice(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	const stall = time.Second
	s, err := NewS3(S3Options{Endpoint: f.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"results/r/stat-held", "results/r/get-held"} {
		if err := s.Put(ctx, key, strings.NewReader("x"), 1); err != nil {
			t.Fatal(err)
		}
	}
	get := func(key string) error {
		r, err := s.Get(ctx, key)
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.ReadAll(r)
		return err
	}
	for _, c := range []struct {
		what  string
		fault testsvc.Fault
		op    func() error
		sent  string // the held request, as the proxy counts it
	}{
		{"a put", testsvc.Fault{Path: "results/r/put-held"},
			func() error { return s.Put(ctx, "results/r/put-held", strings.NewReader("x"), 1) }, "PUT /kiln/results/r/put-held"},
		{"a get, at its stat", testsvc.Fault{Path: "results/r/stat-held"},
			func() error { return get("results/r/stat-held") }, "HEAD /kiln/results/r/stat-held"},
		{"a get, at its GET", testsvc.Fault{Method: "GET", Path: "results/r/get-held"},
			func() error { return get("results/r/get-held") }, "GET /kiln/results/r/get-held"},
	} {
		rule := c.fault
		rule.Action = testsvc.Hold
		f.Add(rule)
		err := within(t, c.what, c.op)
		if err == nil || !Unreachable(err) {
			t.Fatalf("%s to a store that holds every request: %v (Unreachable %v); want it failed as the store not answering", c.what, err, Unreachable(err))
		}
		if n := f.Acted(c.sent); n != 2 {
			t.Errorf("%s to a store that holds every request: %s sent %d times, want 2", c.what, c.sent, n)
		}
		if got, want := Outage(err), "does not answer: a request stalled 2 times, nothing sent or received for 1s each time"; !strings.Contains(got, want) {
			t.Errorf("%s: Outage(%v) = %q; want it to say %q", c.what, err, got, want)
		}
	}
	f.Clear()
	if err := get("results/r/get-held"); err != nil {
		t.Fatalf("a get once the store answers again: %v", err)
	}
}

// A stall takes one of a request's tries and leaves it the others: a put
// or a get throttled (503 SlowDown) four times succeeds at its fifth try,
// as does a put that stalled once and then was throttled three times; but
// one that stalls again after a throttled try is given up on at once, its
// third try.
func TestS3StallLeavesOtherTries(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	f := srv.Faults(t)
	// Longer than the others: the tries after a stall must be answered
	// within it.
	s, err := NewS3(S3Options{Endpoint: f.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	put := func(key string) error { return s.Put(ctx, key, strings.NewReader(key), int64(len(key))) }
	slowDown := func(method, key string, n int) testsvc.Fault {
		return testsvc.Fault{Method: method, Path: key, Action: testsvc.Status, Code: http.StatusServiceUnavailable, Count: n}
	}
	hold := func(key string) testsvc.Fault { return testsvc.Fault{Path: key, Action: testsvc.Hold, Count: 1} }

	const throttled = "results/r/throttled"
	f.Add(slowDown("PUT", throttled, 4))
	if err := within(t, "a throttled put", func() error { return put(throttled) }); err != nil {
		t.Fatalf("a put throttled four times: %v; want it in at the fifth try", err)
	}
	f.Add(slowDown("GET", throttled, 4))
	err = within(t, "a throttled get", func() error {
		r, err := s.Get(ctx, throttled)
		if err != nil {
			return err
		}
		defer r.Close()
		got, err := io.ReadAll(r)
		if err == nil && string(got) != throttled {
			t.Errorf("a get throttled four times read %q, want %q", got, throttled)
		}
		return err
	})
	if err != nil {
		t.Fatalf("a get throttled four times: %v; want it read at the fifth try", err)
	}
	if n, m := f.Acted("PUT /kiln/"+throttled), f.Acted("GET /kiln/"+throttled); n != 4 || m != 4 {
		t.Errorf("%d PUTs and %d GETs throttled, want 4 of each", n, m)
	}

	const once = "results/r/stalled-once"
	f.Add(hold(once))
	f.Add(slowDown("PUT", once, 3))
	if err := within(t, "a put that stalled once", func() error { return put(once) }); err != nil {
		t.Fatalf("a put that stalled once, then was throttled three times: %v; want it in at the fifth try", err)
	}
	if n := f.Acted("PUT /kiln/" + once); n != 4 {
		t.Errorf("a put that stalled once: the proxy acted on %d PUTs, want 4 (1 held, 3 throttled)", n)
	}

	const twice = "results/r/stalled-twice"
	f.Add(hold(twice))
	f.Add(slowDown("PUT", twice, 1))
	f.Add(hold(twice))
	err = within(t, "a put that stalled twice", func() error { return put(twice) })
	if err == nil || !Unreachable(err) {
		t.Fatalf("a put that stalled, was throttled and stalled again: %v; want it failed as the store not answering", err)
	}
	if n := f.Acted("PUT /kiln/" + twice); n != 3 {
		t.Errorf("a put that stalled twice: the proxy acted on %d PUTs, want 3 (held, throttled, held) and no fourth try", n)
	}
	if _, err := s.Stat(ctx, twice); !errors.Is(err, ErrNotFound) {
		t.Errorf("a put given up on left an object: %v", err)
	}
}

// A download whose body stops coming is asked for its rest once: when that
// stalls too, the body gives up, where it asked up to four times, each
// request tried five times, a stall each.
func TestS3StalledBodyIsAskedForOnce(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	proxy := newStallProxy(t, srv.Endpoint)
	s, err := NewS3(S3Options{Endpoint: proxy.addr(), Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, StallTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := make([]byte, 8<<20)
	rand.Read(body)
	const key = "checkpoints/r/step-0000100/model.safetensors"
	if err := s.Put(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	// Paced, most of the body is still on its way when the proxy freezes.
	proxy.setPace(10 * time.Millisecond)
	r, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := io.ReadFull(r, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	proxy.freeze()
	before := proxy.accepted.Load()
	var n int64
	err = within(t, "a get's body", func() error {
		var err error
		n, err = io.Copy(io.Discard, r)
		return err
	})
	if err == nil || !Unreachable(err) || n+1024 >= int64(len(body)) {
		t.Fatalf("a body the store stopped sending: read %d more bytes, %v (Unreachable %v); want it failed as the store not answering", n, err, Unreachable(err))
	}
	if got := proxy.accepted.Load() - before; got != 1 {
		t.Errorf("the body's rest was asked for on %d connections, want 1", got)
	}
	if !strings.Contains(Outage(err), "does not answer") {
		t.Errorf("Outage(%v) = %q; want it to say that the store does not answer", err, Outage(err))
	}
}
