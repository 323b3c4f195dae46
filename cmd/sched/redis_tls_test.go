package main

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A rediss:// URL reaches a Redis that speaks TLS, as the README says,
// where this machine trusts the certificate authority that signed the
// server's certificate (here named in SSL_CERT_FILE). One it does not
// trust, or a URL whose host the certificate does not name, is refused in
// one line that says what to do.
func TestRedissReachesARedisThatSpeaksTLS(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedisTLS(t)
	trusted := "SSL_CERT_FILE=" + r.CAFile
	out, errOut, code := sched(t, []string{"KILN_REDIS_URL=" + r.URL(0), trusted}, "config", "--check")
	if code != 0 || !strings.Contains(out, "redis and object store reachable\n") {
		t.Fatalf("config --check over %s: exit %d\n%s%s", r.URL(0), code, out, errOut)
	}
	if out, errOut, code := sched(t, []string{"KILN_REDIS_URL=" + r.URL(0), trusted}, "status"); code != 0 || !strings.Contains(out, "WORKERS\n") {
		t.Fatalf("status over %s: exit %d\n%s%s", r.URL(0), code, out, errOut)
	}
	_, port, _ := strings.Cut(r.Addr, ":")
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"KILN_REDIS_URL=" + r.URL(0)}, "the certificate of Redis at " + r.Addr + " is signed by an authority this machine does not trust: add that authority's certificate to the system's trusted ones, or name its PEM file in SSL_CERT_FILE"},
		{[]string{"KILN_REDIS_URL=rediss://localhost:" + port + "/0", trusted}, "the certificate of Redis at localhost:" + port + " does not name localhost: give the URL a host it names"},
	} {
		wantRefused(t, c.env, c.want, "status")
	}
}
