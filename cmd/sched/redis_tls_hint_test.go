package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// The two TLS set-ups that fail with a bare transport error say why on
// the command line: a redis:// URL to a Redis that speaks TLS alone
// ("EOF") is told to use rediss://, and a rediss:// URL to a Redis that
// requires client certificates, Redis's own default with TLS, is told
// what to change on that Redis; the password stays masked.
func TestTheCommandLineSaysWhyATLSRedisIsNotReached(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedisTLS(t)
	pem, err := os.ReadFile(r.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	// One connection, made before the settings below, which it outlives:
	// Redis reads them at each connection's start.
	admin := redis.NewClient(&redis.Options{Addr: r.Addr, TLSConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}, PoolSize: 1})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "requirepass", "TlsRedisPw42").Err(); err != nil {
		t.Fatal(err)
	}
	trusted := "SSL_CERT_FILE=" + r.CAFile
	wantRefused(t, []string{"KILN_REDIS_URL=redis://:TlsRedisPw42@" + r.Addr + "/0", trusted},
		"cannot reach Redis at redis://:xxxxx@"+r.Addr+"/0 (KILN_REDIS_URL or --redis-url): EOF (the server closed the connection at once, as a Redis that speaks TLS alone does to redis://: use rediss:// for a Redis with TLS)",
		"status")
	if err := admin.ConfigSet(ctx, "tls-auth-clients", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, []string{"KILN_REDIS_URL=rediss://:TlsRedisPw42@" + r.Addr + "/0", trusted},
		"remote error: tls: certificate required (Redis at "+r.Addr+" requires a client certificate (tls-auth-clients yes, Redis's default with TLS), which kiln cannot present: set tls-auth-clients no (or optional) in that Redis's configuration)",
		"status")
	for _, args := range [][]string{{"status"}, {"config", "--check"}} {
		if _, errOut, _ := sched(t, []string{"KILN_REDIS_URL=redis://:TlsRedisPw42@" + r.Addr + "/0", trusted}, args...); strings.Contains(errOut, "TlsRedisPw42") {
			t.Errorf("sched %v showed the password: %s", args, errOut)
		}
	}
}
