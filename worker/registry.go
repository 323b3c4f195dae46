package worker

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/scheduler"
)

// Handlers are the task handlers a worker serves, given to New. Each group
// is a value holding its dependencies; New checks them, resolves their
// defaults once, and registers one handler per kind, so that a worker
// missing a dependency fails when it is built, naming the field, not when
// its first task arrives. The kinds of a nil group are not served: their
// tasks are archived as unavailable in this build.
type Handlers struct {
	// Ingest handles ingest:plan, ingest:shard and ingest:append.
	Ingest *Ingest
	// Tokenizers handles tokenizer:sample and tokenizer:train.
	Tokenizers *Tokenizers
	// Training handles train:segment, and bench:run when it has Bench.
	Training *Training
	// Extra are handlers of kinds outside the product set (a test's).
	Extra []Handler
}

// Handler handles the tasks of one kind.
type Handler struct {
	kind string
	h    asynq.Handler
}

// HandlerFunc makes fn the handler of A's kind. The payload is decoded
// once, here at the edge, so fn sees only the typed value; a payload this
// build cannot read is archived without a retry.
func HandlerFunc[A scheduler.Args](fn func(ctx context.Context, a A) error) Handler {
	var zero A
	return Handler{kind: zero.Kind(), h: asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		a, err := scheduler.Decode[A](t.Payload())
		if err != nil {
			return err
		}
		return fn(ctx, a)
	})}
}

// Kind is the task kind h handles.
func (h Handler) Kind() string { return h.kind }

// handlerSet maps each kind a worker serves to its handler.
type handlerSet map[string]asynq.Handler

func (s handlerSet) kinds() []string {
	ks := make([]string, 0, len(s))
	for k := range s {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (s handlerSet) add(h Handler) error {
	if h.h == nil || h.kind == "" {
		return errors.New("worker: a Handler was not made by HandlerFunc")
	}
	if _, known := scheduler.PolicyFor(h.kind); !known {
		return fmt.Errorf("worker: handler for kind %q, which has no policy: define it with scheduler.Define", h.kind)
	}
	if _, dup := s[h.kind]; dup {
		return fmt.Errorf("worker: two handlers for kind %s", h.kind)
	}
	s[h.kind] = h.h
	return nil
}

// build checks every group and registers its handlers.
func (hs Handlers) build() (handlerSet, error) {
	s := handlerSet{}
	var all []Handler
	if hs.Ingest != nil {
		c, err := hs.Ingest.resolve()
		if err != nil {
			return nil, groupError("Ingest", err)
		}
		all = append(all, HandlerFunc(c.plan), HandlerFunc(c.shard), HandlerFunc(c.append))
	}
	if hs.Tokenizers != nil {
		c, err := hs.Tokenizers.resolve()
		if err != nil {
			return nil, groupError("Tokenizers", err)
		}
		all = append(all, HandlerFunc(c.sample), HandlerFunc(c.train))
	}
	if hs.Training != nil {
		c, err := hs.Training.resolve()
		if err != nil {
			return nil, groupError("Training", err)
		}
		all = append(all, HandlerFunc(c.segment))
		if c.Bench != nil {
			all = append(all, HandlerFunc(c.bench))
		}
	}
	all = append(all, hs.Extra...)
	for _, h := range all {
		if err := s.add(h); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// requiredError is a group's missing dependency; its text begins with the
// field's name, so that build's error reads Handlers.<Group>.<Field>.
type requiredError struct{ field, why string }

func (e *requiredError) Error() string { return e.field + " is required: " + e.why }

// groupError is the error of a group's resolve. A missing dependency is
// the program's, named by its field (Handlers.<Group>.<Field>); any other
// comes of what the group reads as it starts (a setting, a directory), and
// names that input and what to do for the person who runs the worker, who
// sets variables and knows no fields: no field path goes before it.
func groupError(group string, err error) error {
	var req *requiredError
	if errors.As(err, &req) {
		return fmt.Errorf("worker: Handlers.%s.%w", group, err)
	}
	return fmt.Errorf("worker: %w", err)
}

// checkQueues refuses a queue that none of the handlers' kinds is on: its
// tasks would all be archived as unavailable.
func (s handlerSet) checkQueues(queues map[string]int) error {
	served := map[string]bool{}
	for k := range s {
		if p, ok := scheduler.PolicyFor(k); ok {
			served[p.Queue] = true
		}
	}
	for q := range queues {
		if !served[q] {
			var kinds []string
			for _, k := range scheduler.Kinds() {
				if p, _ := scheduler.PolicyFor(k); p.Queue == q {
					kinds = append(kinds, k)
				}
			}
			return fmt.Errorf("worker: queue %s is served but no handler is given for its kinds (%v): set the Handlers group that handles them", q, kinds)
		}
	}
	return nil
}

// UnavailableError is a known kind whose handler is not in this build.
// Retrying on this worker cannot help, so the task is archived; re-run it
// from the archive (asynqmon) once a worker that has it is deployed.
type UnavailableError struct {
	Kind string
	// Handlers are the kinds this worker handles.
	Handlers []string
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("task kind %s is not available on this worker (handlers: %v); the task is archived", e.Kind, e.Handlers)
}

func (e *UnavailableError) Unwrap() error { return asynq.SkipRetry }

// mux dispatches on the task's kind, like asynq.ServeMux, except that a
// missing handler is a final error, not a retry.
type mux struct{ set handlerSet }

func (m mux) ProcessTask(ctx context.Context, t *asynq.Task) error {
	kind, known := scheduler.CanonicalKind(t.Type())
	h := m.set[kind]
	switch {
	case h != nil:
		return h.ProcessTask(ctx, t)
	case known:
		return &UnavailableError{Kind: kind, Handlers: m.set.kinds()}
	default:
		return &scheduler.UnknownKindError{Kind: t.Type()}
	}
}
