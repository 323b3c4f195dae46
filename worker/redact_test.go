package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/redact"
	"github.com/kiln-lm/kiln/scheduler"
)

// quoteArgs is a task whose handler quotes a secret, as a library or a
// server's answer may (a proxy that echoes the Authorization header).
type quoteArgs struct{ Secret string }

func (quoteArgs) Kind() string { return kindQuote }

const kindQuote = "test:quote"

func init() {
	noRetry := testPolicy
	noRetry.MaxRetry = 0
	scheduler.Define(kindQuote, noRetry)
}

// A secret of the worker's configuration that a task's error or progress
// quotes is hidden in what the worker logs and writes to Redis, where sched
// status, sched runs and asynqmon show it; the error still says what it
// was (here a final one, archived without a retry).
func TestATaskQuotingASecretKeepsItHidden(t *testing.T) {
	t.Parallel()
	const token = "hf_SECRETtoken123"
	e := newEnv(t)
	core, logs := observer.New(zap.DebugLevel)
	e.log = zap.New(core)
	e.redact = func(s string) string { return redact.Secrets(s, token) }
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(func(ctx context.Context, a quoteArgs) error {
		return fmt.Errorf("401: echo: Bearer %s: %w", a.Secret, errors.New("refused"))
	}))
	e.startInProcess()
	id := e.enqueue(quoteArgs{Secret: token})
	ts := e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, "401: echo: Bearer "+redact.Mask+": refused") || strings.Contains(ts.LastErr, token) {
		t.Errorf("the task's error in Redis: %q; want it whole, the token masked", ts.LastErr)
	}
	if !ts.HasProgress || strings.Contains(ts.Progress.Message, token) || !strings.Contains(ts.Progress.Message, "refused") {
		t.Errorf("the task's progress in Redis: %+v; want its last word, the token masked", ts.Progress)
	}
	for _, l := range logs.All() {
		if strings.Contains(fmt.Sprint(l.Message, l.ContextMap()), token) {
			t.Errorf("the worker logged the token: %s %v", l.Message, l.ContextMap())
		}
	}
}
