package hub_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// dropProxy forwards TCP connections to target until drop, after which the
// connections it holds carry nothing either way and stay open, as a NAT or
// proxy that forgot them does; connections made after drop are forwarded.
type dropProxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	live   []*dropConn
	conns  int
}

type dropConn struct {
	mu      sync.Mutex
	dropped bool
}

func (d *dropConn) isDropped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dropped
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{l: l, target: target}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			dc := &dropConn{}
			p.mu.Lock()
			p.live = append(p.live, dc)
			p.conns++
			p.mu.Unlock()
			t.Cleanup(func() { c.Close(); up.Close() })
			go pipe(up, c, dc)
			go pipe(c, up, dc)
		}
	}()
	return p
}

// pipe copies src to dst until dc is dropped, then reads src and discards.
func pipe(dst io.Writer, src io.Reader, dc *dropConn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !dc.isDropped() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// drop silences every connection made so far.
func (p *dropProxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, dc := range p.live {
		dc.mu.Lock()
		dc.dropped = true
		dc.mu.Unlock()
	}
}

func (p *dropProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conns
}

// An HTTP/2 connection that goes silent (dropped by a NAT or proxy on the
// way) is found by its health check and closed, so that the retry after a
// stall takes a new connection: a stall resets only its own stream, and
// every retry on the silent connection would stall in turn.
func TestASilentHTTP2ConnectionIsLeftForANewOne(t *testing.T) {
	h := newHub(t)
	h.Add(repo, "a.txt", []byte("a"), false)
	var mu sync.Mutex
	var protos []string
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos = append(protos, r.Proto)
		mu.Unlock()
		h.Server.Config.Handler.ServeHTTP(w, r)
	}))
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(ts.Close)
	p := newDropProxy(t, ts.Listener.Addr().String())
	c, err := hub.New(hub.Config{Endpoint: "https://" + p.l.Addr().String(), HTTPClient: ts.Client(),
		StallTimeout: 400 * time.Millisecond, MaxRetries: 8, MaxWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(context.Background(), repo, "main", ""); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	first := protos[0]
	mu.Unlock()
	if first != "HTTP/2.0" {
		t.Fatalf("the listing went over %s; the test needs HTTP/2", first)
	}
	p.drop()
	files, err := c.List(context.Background(), repo, "main", "")
	if err != nil || len(files) != 1 {
		t.Fatalf("listing after the connection went silent: %v, %v; want it listed over a new connection", files, err)
	}
	if n := p.connections(); n < 2 {
		t.Fatalf("%d connection(s) made; want a new one after the first went silent", n)
	}
}
