// Package testsvc starts the real servers that kiln's tests talk to:
// redis-server and versitygw (an S3 server with a POSIX backend). Each runs
// as a child process on a free loopback port with its data in t.TempDir(),
// and is stopped by t.Cleanup. Nothing here fakes a protocol.
//
// Usage:
//
//	addr := testsvc.Redis(t)                 // "127.0.0.1:PORT", a fresh server
//	r := testsvc.StartRedis(t)               // a handle: r.Addr, r.URL(db), r.Stop, r.Start, r.Kill
//	r := testsvc.StartRedisTLS(t)            // one that speaks TLS alone: r.URL(db) is rediss://,
//	                                         // its CA's certificate in r.CAFile
//	s := testsvc.S3(t)                       // s.Endpoint ("127.0.0.1:PORT"), s.AccessKey, s.SecretKey,
//	                                         // s.URL(), s.Stop, s.Start, s.Kill
//
// Stop and Start restart a server on the same port with the same data
// directory, so a client configured once sees the server go away and come
// back: Redis keeps its data (append-only file), S3 keeps its objects.
//
// The binaries are looked up on PATH, then in $(go env GOPATH)/bin. When one
// is missing the test fails (it is not skipped: CI must run these tests)
// with a message saying to run `make test`, which installs both.
//
// Readiness is detected by polling the server's protocol (PING for Redis,
// an HTTP request for S3), never by sleeping a fixed time.
package testsvc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a server may take to answer after exec.
// redis-server answers in ~10 ms and versitygw in ~100 ms on a 2-core CI box;
// the margin covers a loaded machine.
const startTimeout = 30 * time.Second

// stopTimeout bounds a graceful stop before the process is killed.
const stopTimeout = 15 * time.Second

// process is a restartable child process bound to one port.
type process struct {
	t       testing.TB
	name    string // for messages: "redis-server", "versitygw"
	bin     string
	args    []string
	logPath string
	ready   func(ctx context.Context) error

	mu  sync.Mutex
	cmd *exec.Cmd
	// exited is closed when cmd has been waited for.
	exited chan struct{}
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s already running", p.name)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		err := p.ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			p.cmd = nil
			return fmt.Errorf("%s exited before it was ready: %s", p.name, p.logTail())
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			p.cmd = nil
			return fmt.Errorf("%s not ready after %v (%v): %s", p.name, startTimeout, err, p.logTail())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop signals the process and waits for it to exit; after stopTimeout it
// is killed. A stopped process is not an error.
func (p *process) stop(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}

// pid is the running process's id, or 0.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *process) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	if len(b) == 0 {
		return "(no output; log " + p.logPath + ")"
	}
	return string(b)
}

// launch starts p on a free port chosen by args(port), retrying with a new
// port if another process took the chosen one between probe and bind.
func launch(t testing.TB, p *process, args func(port int) []string) int {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("testsvc: no free loopback port: %v", err)
		}
		p.args = args(port)
		if lastErr = p.start(); lastErr == nil {
			t.Cleanup(func() { p.stop(syscall.SIGTERM) })
			return port
		}
	}
	t.Fatalf("testsvc: %v", lastErr)
	return 0
}

// freePort asks the kernel for an unused loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var (
	gopathOnce sync.Once
	gopathBin  string
)

// findBinary looks for name on PATH, then in $(go env GOPATH)/bin.
func findBinary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	gopathOnce.Do(func() {
		gp := os.Getenv("GOPATH")
		if gp == "" {
			if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
				gp = strings.TrimSpace(string(out))
			}
		}
		if gp == "" {
			if home, err := os.UserHomeDir(); err == nil {
				gp = filepath.Join(home, "go")
			}
		}
		// GOPATH may list several directories; go install uses the first.
		if i := strings.IndexRune(gp, os.PathListSeparator); i >= 0 {
			gp = gp[:i]
		}
		if gp != "" {
			gopathBin = filepath.Join(gp, "bin")
		}
	})
	if gopathBin != "" {
		p := filepath.Join(gopathBin, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	t.Fatalf("testsvc: %s not found on PATH or in %s: run `make test` (it installs the test services) or install %s yourself", name, gopathBin, name)
	return ""
}

// RedisServer is a redis-server child process. Its data survives Stop/Start.
type RedisServer struct {
	// Addr is host:port on loopback.
	Addr string
	// CAFile, for a server that speaks TLS, is the PEM file of the
	// certificate authority that signed its certificate, which names
	// 127.0.0.1: a client trusts the server by it (SSL_CERT_FILE). Empty
	// for a server without TLS.
	CAFile string
	p      *process
	dir    string
}

// Redis starts a fresh redis-server and returns its address.
func Redis(t testing.TB) string {
	t.Helper()
	return StartRedis(t).Addr
}

// StartRedis starts a fresh redis-server and returns a handle that can stop
// and restart it on the same port and data directory.
func StartRedis(t testing.TB) *RedisServer {
	t.Helper()
	return startRedis(t, nil)
}

// StartRedisTLS is StartRedis for a server that speaks TLS alone, with a
// certificate for 127.0.0.1 signed by a certificate authority of its own
// (RedisServer.CAFile). It asks clients for no certificate.
func StartRedisTLS(t testing.TB) *RedisServer {
	t.Helper()
	dir := t.TempDir()
	ca, cert, key, err := writeCertificates(dir)
	if err != nil {
		t.Fatalf("testsvc: certificates for redis-server: %v", err)
	}
	r := startRedis(t, func(port string) []string {
		return []string{"--port", "0", "--tls-port", port, "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"}
	})
	r.CAFile = ca
	return r
}

// startRedis starts redis-server listening as listen says for a port (a
// plain one where listen is nil).
func startRedis(t testing.TB, listen func(port string) []string) *RedisServer {
	t.Helper()
	bin := findBinary(t, "redis-server")
	dir := t.TempDir()
	r := &RedisServer{dir: dir}
	var tlsConfig *tls.Config
	if listen == nil {
		listen = func(port string) []string { return []string{"--port", port} }
	} else {
		// Readiness over TLS, the server's certificate unchecked: what is
		// asked is whether it answers.
		tlsConfig = &tls.Config{InsecureSkipVerify: true}
	}
	r.p = &process{
		t:       t,
		name:    "redis-server",
		bin:     bin,
		logPath: filepath.Join(dir, "redis.log"),
		ready:   func(ctx context.Context) error { return redisPing(ctx, r.Addr, tlsConfig) },
	}
	launch(t, r.p, func(port int) []string {
		r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		return append(listen(strconv.Itoa(port)),
			"--bind", "127.0.0.1",
			"--dir", dir,
			"--daemonize", "no",
			"--save", "",
			// The append-only file keeps queued tasks across Stop/Start,
			// as in the compose stack; noeviction for the same reason as
			// there (evicted keys make asynq report false lease expiries).
			"--appendonly", "yes",
			"--appendfsync", "always",
			"--maxmemory-policy", "noeviction",
		)
	})
	return r
}

// URL returns a redis:// URL for database db, rediss:// for a server that
// speaks TLS.
func (r *RedisServer) URL(db int) string {
	scheme := "redis"
	if r.CAFile != "" {
		scheme = "rediss"
	}
	return fmt.Sprintf("%s://%s/%d", scheme, r.Addr, db)
}

// Stop shuts the server down gracefully (SIGTERM) and waits for it to exit.
// Pid is the server's process id while it runs, else 0: for measuring its
// CPU time beside a benchmark's.
func (r *RedisServer) Pid() int { return r.p.pid() }

func (r *RedisServer) Stop() { r.p.stop(syscall.SIGTERM) }

// Kill stops the server with SIGKILL, as a crash would.
func (r *RedisServer) Kill() { r.p.stop(syscall.SIGKILL) }

// Start restarts a stopped server on the same port and data directory and
// waits until it answers PING.
func (r *RedisServer) Start() {
	r.p.t.Helper()
	if err := r.p.start(); err != nil {
		r.p.t.Fatalf("testsvc: restart: %v", err)
	}
}

// StartEmpty restarts a stopped server on the same port with none of its
// data, as a Redis whose disk was lost, or one run without persistence,
// comes back: its data directory emptied first.
func (r *RedisServer) StartEmpty() {
	r.p.t.Helper()
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		r.p.t.Fatalf("testsvc: empty Redis's data: %v", err)
	}
	for _, e := range ents {
		if p := filepath.Join(r.dir, e.Name()); p != r.p.logPath {
			if err := os.RemoveAll(p); err != nil {
				r.p.t.Fatalf("testsvc: empty Redis's data: %v", err)
			}
		}
	}
	r.Start()
}

// redisPing speaks just enough RESP to learn that the server is accepting
// commands (and not still loading its data set): over TLS where tlsConfig
// is not nil.
func redisPing(ctx context.Context, addr string, tlsConfig *tls.Config) error {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var c net.Conn
	var err error
	if tlsConfig != nil {
		c, err = (&tls.Dialer{Config: tlsConfig}).DialContext(dctx, "tcp", addr)
	} else {
		c, err = (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New(strings.TrimSpace(line))
	}
	return nil
}

// S3Server is a versitygw child process serving S3 from a POSIX directory.
// Its objects survive Stop/Start.
type S3Server struct {
	// Endpoint is host:port on loopback, plain HTTP (minio-go's endpoint form).
	Endpoint  string
	AccessKey string
	SecretKey string
	// Dir is the backend directory: each bucket is a subdirectory.
	Dir string
	p   *process
}

// S3 starts a fresh versitygw with a POSIX backend in t.TempDir(). It has no
// buckets; clients create what they need.
func S3(t testing.TB) *S3Server {
	t.Helper()
	bin := findBinary(t, "versitygw")
	dir := t.TempDir()
	s := &S3Server{
		AccessKey: "kilntestaccess",
		SecretKey: "kilntestsecret0123456789",
		Dir:       filepath.Join(dir, "data"),
	}
	if err := os.Mkdir(s.Dir, 0o755); err != nil {
		t.Fatalf("testsvc: %v", err)
	}
	s.p = &process{
		t:       t,
		name:    "versitygw",
		bin:     bin,
		logPath: filepath.Join(dir, "versitygw.log"),
		ready:   func(ctx context.Context) error { return httpUp(ctx, "http://"+s.Endpoint+"/") },
	}
	launch(t, s.p, func(port int) []string {
		s.Endpoint = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		return []string{
			"--port", s.Endpoint,
			"--access", s.AccessKey,
			"--secret", s.SecretKey,
			"--quiet",
			"posix", s.Dir,
		}
	})
	return s
}

// URL returns the endpoint as an http:// URL.
func (s *S3Server) URL() string { return "http://" + s.Endpoint }

// Stop shuts the server down gracefully (SIGTERM) and waits for it to exit.
// Pid is the server's process id while it runs, else 0.
func (s *S3Server) Pid() int { return s.p.pid() }

func (s *S3Server) Stop() { s.p.stop(syscall.SIGTERM) }

// Kill stops the server with SIGKILL.
func (s *S3Server) Kill() { s.p.stop(syscall.SIGKILL) }

// Start restarts a stopped server on the same port and directory and waits
// until it answers HTTP.
func (s *S3Server) Start() {
	s.p.t.Helper()
	if err := s.p.start(); err != nil {
		s.p.t.Fatalf("testsvc: restart: %v", err)
	}
}

// StartWithKeys restarts a stopped server on the same port and directory
// with other credentials (keys rotated or revoked under clients that keep
// the old ones), and waits until it answers HTTP. AccessKey and SecretKey
// keep the keys it was started with; Start starts it with those again.
func (s *S3Server) StartWithKeys(access, secret string) {
	s.p.t.Helper()
	args := append([]string(nil), s.p.args...)
	s.p.args = []string{"--port", s.Endpoint, "--access", access, "--secret", secret, "--quiet", "posix", s.Dir}
	defer func() { s.p.args = args }()
	if err := s.p.start(); err != nil {
		s.p.t.Fatalf("testsvc: restart with other keys: %v", err)
	}
}

// httpUp succeeds once the server answers HTTP at all: an unauthenticated
// request gets 403 from a working S3 server, which is what "up" means here.
func httpUp(ctx context.Context, url string) error {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
