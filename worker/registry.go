package worker

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/hibiken/asynq"
	"github.com/kiln-lm/kiln/scheduler"
)

// Handler-registration API. Product code registers one handler per kind
// from an init function in its own file of this package (worker/ingest.go,
// worker/train.go), e.g.
//
//	func init() {
//		worker.Register(func(ctx context.Context, a scheduler.IngestShard) error {
//			p := worker.Progress(ctx)
//			... call into ingest/ ...
//		})
//	}
//
// The payload is decoded once, here at the edge; a payload this build
// cannot read is archived without a retry.

var (
	regMu    sync.RWMutex
	registry = map[string]asynq.Handler{}
)

// Register installs fn as the handler of A's kind. It panics on a second
// registration for one kind, which would be a build mistake.
func Register[A scheduler.Args](fn func(ctx context.Context, a A) error) {
	var zero A
	RegisterHandler(zero.Kind(), asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		a, err := scheduler.Decode[A](t.Payload())
		if err != nil {
			return err
		}
		return fn(ctx, a)
	}))
}

// RegisterHandler installs a raw asynq handler for kind.
func RegisterHandler(kind string, h asynq.Handler) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[kind]; dup {
		panic(fmt.Sprintf("worker: handler for %s registered twice", kind))
	}
	registry[kind] = h
}

// Registered returns the kinds with a handler in this build, sorted.
func Registered() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	ks := make([]string, 0, len(registry))
	for k := range registry {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// UnavailableError is a known kind whose handler is not in this build.
// Retrying on this worker cannot help, so the task is archived; re-run it
// from the archive (asynqmon) once a worker that has it is deployed.
type UnavailableError struct{ Kind string }

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("task kind %s is not available in this build (handlers: %v); the task is archived", e.Kind, Registered())
}

func (e *UnavailableError) Unwrap() error { return asynq.SkipRetry }

// mux dispatches on the task's kind, like asynq.ServeMux, except that a
// missing handler is a final error, not a retry.
type mux struct{}

func (mux) ProcessTask(ctx context.Context, t *asynq.Task) error {
	kind, known := scheduler.CanonicalKind(t.Type())
	regMu.RLock()
	h := registry[kind]
	regMu.RUnlock()
	switch {
	case h != nil:
		return h.ProcessTask(ctx, t)
	case known:
		return &UnavailableError{Kind: kind}
	default:
		return &scheduler.UnknownKindError{Kind: t.Type()}
	}
}
