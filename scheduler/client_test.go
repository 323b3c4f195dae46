package scheduler

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A rediss:// URL pointed at a Redis without TLS fails its ping with no
// more than a timeout; the error adds what rediss:// means. Over plain
// redis:// the same server answers, and a refused connection, which is not
// a question of TLS, gets no such hint.
func TestPingOverTLSToAPlainRedisSaysWhatRedissMeans(t *testing.T) {
	t.Parallel()
	addr := testsvc.Redis(t)
	ping := func(url string, within time.Duration) error {
		opt, err := asynq.ParseRedisURI(url)
		if err != nil {
			t.Fatal(err)
		}
		c := NewClient(opt)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		return c.Ping(ctx)
	}
	const hint = "rediss:// means TLS, which this server may not speak: use redis:// for a Redis without TLS"
	// The deadline is the failure under test here, as the command line's
	// first ping has 5 s.
	if err := ping("rediss://"+addr+"/0", time.Second); err == nil || !strings.Contains(err.Error(), hint) {
		t.Errorf("rediss:// to a plain Redis: %v; want the hint %q", err, hint)
	}
	// Answers and refusals come back at once; the deadlines below are
	// never reached.
	if err := ping("redis://"+addr+"/0", time.Minute); err != nil {
		t.Errorf("redis:// to the same Redis: %v", err)
	}
	if err := ping("rediss://127.0.0.1:1/0", time.Minute); err == nil || strings.Contains(err.Error(), "rediss://") {
		t.Errorf("rediss:// to a closed port: %v; want a refusal without the TLS hint", err)
	}
}
