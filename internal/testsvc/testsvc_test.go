package testsvc

import (
	"bytes"
	"context"
	"crypto/x509"
	"io"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/redis/go-redis/v9"
)

func TestRedisSurvivesRestart(t *testing.T) {
	t.Parallel()
	r := StartRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	pid := r.Pid()
	if err := syscall.Kill(pid, 0); pid <= 0 || err != nil {
		t.Fatalf("Pid() = %d (signal 0: %v), want the running server's process", pid, err)
	}
	r.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded against a stopped server")
	}
	if r.Pid() != 0 {
		t.Fatalf("Pid() = %d after Stop, want 0", r.Pid())
	}
	r.Start()
	if r.Pid() <= 0 || r.Pid() == pid {
		t.Fatalf("Pid() = %d after a restart (was %d), want the new process", r.Pid(), pid)
	}
	got, err := c.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		t.Fatalf("after restart: Get = %q, %v; want \"v\" (append-only data kept)", got, err)
	}
}

// StartEmpty brings a stopped server back on its port with none of its
// data, as one whose disk was lost; one started so keeps what is written
// to it after, as any other.
func TestRedisStartEmptyComesBackWithoutItsData(t *testing.T) {
	t.Parallel()
	r := StartRedis(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	r.StartEmpty()
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("after StartEmpty: DBSIZE = %d, %v; want an empty server", n, err)
	}
	if err := c.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	r.Start()
	if got, err := c.Get(ctx, "k2").Result(); err != nil || got != "v2" {
		t.Fatalf("a restart after StartEmpty: Get = %q, %v; want \"v2\"", got, err)
	}
}

func TestRedisInstancesAreIndependent(t *testing.T) {
	t.Parallel()
	a, b := Redis(t), Redis(t)
	if a == b {
		t.Fatalf("two servers share address %s", a)
	}
	ctx := context.Background()
	ca := redis.NewClient(&redis.Options{Addr: a})
	cb := redis.NewClient(&redis.Options{Addr: b})
	defer ca.Close()
	defer cb.Close()
	if err := ca.Set(ctx, "k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := cb.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("key written to %s visible on %s (n=%d, err=%v)", a, b, n, err)
	}
}

func TestS3SurvivesRestart(t *testing.T) {
	t.Parallel()
	s := S3(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := minio.New(s.Endpoint, &minio.Options{
		Creds:      credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		MaxRetries: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(ctx, "bkt", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	body := []byte("hello")
	if _, err := c.PutObject(ctx, "bkt", "x/y", bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if s.Pid() <= 0 {
		t.Fatalf("Pid() = %d while running", s.Pid())
	}
	s.Stop()
	if _, err := c.StatObject(ctx, "bkt", "x/y", minio.StatObjectOptions{}); err == nil {
		t.Fatal("StatObject succeeded against a stopped server")
	}
	if s.Pid() != 0 {
		t.Fatalf("Pid() = %d after Stop, want 0", s.Pid())
	}
	s.Start()
	o, err := c.GetObject(ctx, "bkt", "x/y", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(o)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("after restart: object = %q, %v; want %q", got, err, body)
	}
}

func TestS3RejectsWrongCredentials(t *testing.T) {
	t.Parallel()
	s := S3(t)
	c, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, "wrong", "")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListBuckets(context.Background()); err == nil {
		t.Fatal("ListBuckets with a wrong secret succeeded")
	}
}

// A TLS server answers over TLS to a client that trusts its CA, by the
// rediss:// URL it gives, and not in plain text.
func TestRedisTLSAnswersOverTLS(t *testing.T) {
	t.Parallel()
	r := StartRedisTLS(t)
	pem, err := os.ReadFile(r.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("%s holds no certificate", r.CAFile)
	}
	opt, err := redis.ParseURL(r.URL(0))
	if err != nil || opt.TLSConfig == nil {
		t.Fatalf("URL %s: %v, TLS %v; want rediss://", r.URL(0), err, opt.TLSConfig)
	}
	opt.TLSConfig.RootCAs = pool
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: time.Minute, ReadTimeout: time.Minute})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("PING in plain text answered by the TLS server")
	}
}
