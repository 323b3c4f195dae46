package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
)

// transport is minio-go's default transport (its dial and TLS handshake
// timeouts, proxy from the environment) whose connections fail after
// StallTimeout without progress, and which sends no request of an
// operation again once one of them has stalled twice (stallTransport).
// minio-go's timeouts alone leave a body's transfer unbounded: a write to
// a server that stopped reading blocks once the socket buffers are full,
// and a read of a body the server stopped sending blocks for good.
func (o S3Options) transport() (http.RoundTripper, error) {
	tr, err := minio.DefaultTransport(o.Secure)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	stall := o.StallTimeout
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &stallConn{Conn: c, stall: stall}, nil
	}
	// The connection's deadline bounds the wait for the answer: the
	// transport keeps a read of the connection posted while it sends the
	// request, so it fails StallTimeout after the body's last byte went
	// out. A timer of the transport's own would race it, and a request it
	// ended would not count as stalled.
	tr.ResponseHeaderTimeout = 0
	return &stallTransport{base: tr, stall: stall}, nil
}

// stallChunk is the most a stallConn writes under one deadline: a body
// handed over whole (minio-go's part buffers, 16 MiB) is written in pieces
// so that each piece, not the whole, must move within the stall timeout.
const stallChunk = 256 << 10

// stallConn is a connection whose every read and write must make progress
// within stall: each one moves the deadline of both (a deadline applies to
// reads already waiting too, so the transport's read of the answer, posted
// while the body is still going out, keeps being moved while it does).
type stallConn struct {
	net.Conn
	stall time.Duration
	// onStall, set by the request the connection carries, is called once
	// a read or a write meets the deadline, before the error goes back:
	// the transport may then send the request again on another connection
	// without its RoundTripper knowing (a GET on a connection reused), and
	// the request may fail with the close that follows (a write cut by
	// it) rather than the timeout.
	onStall atomic.Pointer[func()]
}

func (c *stallConn) Read(b []byte) (int, error) {
	if err := c.Conn.SetDeadline(time.Now().Add(c.stall)); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(b)
	c.note(err)
	return n, err
}

func (c *stallConn) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		if err := c.Conn.SetDeadline(time.Now().Add(c.stall)); err != nil {
			return n, err
		}
		m, err := c.Conn.Write(b[:min(len(b), stallChunk)])
		n += m
		if err != nil {
			c.note(err)
			return n, err
		}
		b = b[m:]
	}
	return n, nil
}

func (c *stallConn) note(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if f := c.onStall.Swap(nil); f != nil {
			(*f)()
		}
	}
}

// stallConnOf is the stallConn under a connection the transport hands a
// request (a TLS connection over it), nil if there is none.
func stallConnOf(c net.Conn) *stallConn {
	for {
		switch cc := c.(type) {
		case *stallConn:
			return cc
		case interface{ NetConn() net.Conn }:
			c = cc.NetConn()
		default:
			return nil
		}
	}
}

// stallTries is how many times one request of an operation may stall
// before the operation gives up on the store. minio-go sends a request
// again after any failure of its connection, up to MaxRetries times, and
// a store that takes connections and never answers (a hung server, a stuck
// load balancer) fails each try only after StallTimeout: 10 minutes for
// one request at the defaults. One stall may be a connection lost without
// a reset, which a new one gets past; a second is the store.
const stallTries = 2

// stallBudget counts, for one operation of the store (a put, a get and
// its body, a streamed put's every part), the tries of each of its
// requests that stalled. Once one has stalled stallTries times, every
// request of the operation fails at once: the tries minio-go has left,
// the rest of a body, and the abort of a multipart upload, which the
// store would not answer either (an unfinished upload is dropped later,
// by AbortStaleUploads).
type stallBudget struct {
	mu  sync.Mutex
	n   map[string]int // stalled tries, by "METHOD /bucket/key?query"
	err error          // set once a request stalled stallTries times
}

type stallBudgetKey struct{}

// withStallBudget is ctx carrying a stall budget for the operation it is
// passed to, or ctx itself where it carries one (an operation that calls
// another, as a put checks the bucket, spends its own). A request sent
// without one is tried MaxRetries times whatever its failures.
func withStallBudget(ctx context.Context) context.Context {
	if _, ok := ctx.Value(stallBudgetKey{}).(*stallBudget); ok {
		return ctx
	}
	return context.WithValue(ctx, stallBudgetKey{}, &stallBudget{n: map[string]int{}})
}

// stalledError is the failure of a request of an operation that gave up
// on the store, and of the try that made it give up.
type stalledError struct{ stall time.Duration }

func (e *stalledError) Error() string {
	return fmt.Sprintf("the store takes requests and does not answer: a request stalled %d times, nothing sent or received for %v each time", stallTries, e.stall)
}

func (b *stallBudget) spent() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// stalled counts a stalled try of req, and returns the operation's error
// once the budget is spent.
func (b *stallBudget) stalled(req string, stall time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n[req]++
	if b.n[req] >= stallTries && b.err == nil {
		b.err = &stalledError{stall: stall}
	}
	return b.err
}

// stallTransport counts the stalls of each request in its operation's
// stall budget, found in the request's context, and fails the requests of
// an operation whose budget is spent without sending them. Each
// connection the transport hands the request (the trace's GotConn) tells
// it of its stall, while the request waits for its answer or reads its
// body; the stall that spends the budget cancels the request, so that the
// transport does not send it again either.
type stallTransport struct {
	base  http.RoundTripper
	stall time.Duration
}

func (t *stallTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	b, ok := req.Context().Value(stallBudgetKey{}).(*stallBudget)
	if !ok {
		return t.base.RoundTrip(req)
	}
	if err := b.spent(); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	key := req.Method + " " + req.URL.RequestURI()
	ctx, cancel := context.WithCancelCause(req.Context())
	onStall := func() {
		if err := b.stalled(key, t.stall); err != nil {
			cancel(err)
		}
	}
	var conn atomic.Pointer[stallConn] // that of the try under way
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if c := stallConnOf(info.Conn); c != nil {
				c.onStall.Store(&onStall)
				conn.Store(c)
			}
		},
	})
	// done ends the request: its connection, back in the transport's
	// pool, no longer counts for it.
	done := func() {
		if c := conn.Load(); c != nil {
			c.onStall.CompareAndSwap(&onStall, nil)
		}
		cancel(nil)
	}
	resp, err := t.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		var stalled *stalledError
		if errors.As(context.Cause(ctx), &stalled) {
			err = stalled
		}
		done()
		return nil, err
	}
	resp.Body = &stallBody{ReadCloser: resp.Body, done: done}
	return resp, nil
}

// stallBody is an answer's body that ends its request at its end, at a
// failure or when closed: its connection can stall until then.
type stallBody struct {
	io.ReadCloser
	done func()
}

func (s *stallBody) Read(p []byte) (int, error) {
	n, err := s.ReadCloser.Read(p)
	if err != nil {
		s.done()
	}
	return n, err
}

func (s *stallBody) Close() error {
	err := s.ReadCloser.Close()
	s.done()
	return err
}
