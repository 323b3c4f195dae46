package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"strings"
	"sync"
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
