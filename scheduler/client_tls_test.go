package scheduler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// trustingCA is a rediss:// connection to Redis at addr that trusts the
// certificate authority in the PEM file caFile, as SSL_CERT_FILE makes
// the command line trust it.
func trustingCA(t *testing.T, addr, caFile string) asynq.RedisClientOpt {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", caFile)
	}
	return asynq.RedisClientOpt{Addr: addr, TLSConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}
}

// A redis:// URL pointed at a redis-server that speaks TLS alone fails
// its ping with "EOF", the server having closed the connection on what it
// took for a handshake; the error adds that the server may speak TLS, and
// to use rediss://, which then answers. A redis:// URL to a port where
// nothing listens is no question of TLS, and gets no such hint.
func TestPingWithoutTLSToARedisThatSpeaksTLSSaysUseRediss(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedisTLS(t)
	const hint = "the server closed the connection at once, as a Redis that speaks TLS alone does to redis://: use rediss:// for a Redis with TLS"
	// Answers and refusals come back at once; the deadlines are never
	// reached.
	ping := func(opt asynq.RedisConnOpt) error {
		c := NewClient(opt)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return c.Ping(ctx)
	}
	if err := ping(asynq.RedisClientOpt{Addr: r.Addr}); err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("redis:// to a Redis that speaks TLS alone: %v; want the hint %q", err, hint)
	}
	if err := ping(asynq.RedisClientOpt{Addr: r.Addr, Password: "pw"}); err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("redis:// with a password to a Redis that speaks TLS alone: %v; want the hint %q", err, hint)
	}
	if err := ping(trustingCA(t, r.Addr, r.CAFile)); err != nil {
		t.Errorf("rediss:// to the same Redis: %v", err)
	}
	if err := ping(asynq.RedisClientOpt{Addr: "127.0.0.1:1"}); err == nil || strings.Contains(err.Error(), "rediss://") {
		t.Errorf("redis:// to a closed port: %v; want a refusal without the TLS hint", err)
	}
}

// A redis-server with Redis's own default for TLS, tls-auth-clients yes,
// refuses a client that presents no certificate, which kiln cannot: its
// alert, "certificate required", gets what to change on that Redis. With
// tls-auth-clients optional it answers.
func TestPingToARedisThatRequiresAClientCertificateSaysWhatToChange(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedisTLS(t)
	opt := trustingCA(t, r.Addr, r.CAFile)
	// One connection, made before tls-auth-clients changes, which it
	// outlives: Redis reads it at each connection's handshake.
	admin := redis.NewClient(&redis.Options{Addr: r.Addr, TLSConfig: opt.TLSConfig, PoolSize: 1})
	defer admin.Close()
	ctx := context.Background()
	authClients := func(v string) {
		t.Helper()
		if err := admin.ConfigSet(ctx, "tls-auth-clients", v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ping := func() error {
		c := NewClient(opt)
		defer c.Close()
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return c.Ping(pctx)
	}
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	authClients("yes")
	want := "Redis at " + r.Addr + " requires a client certificate (tls-auth-clients yes, Redis's default with TLS), which kiln cannot present: set tls-auth-clients no (or optional) in that Redis's configuration"
	err := ping()
	if err == nil || !strings.Contains(err.Error(), "tls: certificate required") || !strings.Contains(err.Error(), want) {
		t.Errorf("rediss:// to a Redis that requires a client certificate: %v; want its alert and %q", err, want)
	}
	authClients("optional")
	if err := ping(); err != nil {
		t.Errorf("rediss:// to a Redis whose client certificates are optional: %v", err)
	}
}
