package scheduler

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/hibiken/asynq"
)

// envelope is the JSON stored as a task's payload: the payload version
// beside the typed arguments, so a worker can refuse a version it does not
// read instead of misreading it.
type envelope struct {
	V    int             `json:"v"`
	Args json.RawMessage `json:"args"`
}

// Encode returns a's payload bytes (the versioned envelope).
func Encode(a Args) ([]byte, error) {
	p, ok := policyOf(a)
	if !ok {
		return nil, &UnknownKindError{Kind: a.Kind()}
	}
	raw, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("encode %s payload: %w", a.Kind(), err)
	}
	return json.Marshal(envelope{V: p.Version, Args: raw})
}

// PayloadError is a payload this build cannot read. Retrying cannot fix it,
// so it unwraps to asynq.SkipRetry and the task is archived.
type PayloadError struct {
	Kind string
	Msg  string
}

func (e *PayloadError) Error() string {
	return fmt.Sprintf("task %s: %s", e.Kind, e.Msg)
}

func (e *PayloadError) Unwrap() error  { return asynq.SkipRetry }
func (e *PayloadError) BadInput() bool { return true }

// UnknownKindError is a kind string this build does not know.
type UnknownKindError struct{ Kind string }

func (e *UnknownKindError) Error() string {
	return fmt.Sprintf("unknown task kind %q (known: %v)", e.Kind, Kinds())
}

func (e *UnknownKindError) Unwrap() error  { return asynq.SkipRetry }
func (e *UnknownKindError) BadInput() bool { return true }

// Decode reads a payload written by Encode into A, checking its version.
// It is called once, at the worker's edge; handlers see only the typed value.
func Decode[A Args](data []byte) (A, error) {
	var a A
	kind := a.Kind()
	p, ok := policyOf(a)
	if !ok {
		return a, &UnknownKindError{Kind: kind}
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return a, &PayloadError{kind, fmt.Sprintf("malformed payload (%v): not a kiln task envelope {\"v\":N,\"args\":{...}}; enqueue it with sched enqueue", err)}
	}
	if env.V == 0 {
		// No kiln writes a payload without its version.
		return a, &PayloadError{kind, "payload has no version: it is not a kiln task envelope {\"v\":N,\"args\":{...}}, which every kiln writes; enqueue the work with sched enqueue"}
	}
	if env.V != p.Version {
		return a, &PayloadError{kind, versionMsg(env.V, p.Version)}
	}
	if len(env.Args) == 0 {
		return a, &PayloadError{kind, "payload has no args"}
	}
	if err := json.Unmarshal(env.Args, &a); err != nil {
		return a, &PayloadError{kind, fmt.Sprintf("malformed args: %v", err)}
	}
	return a, nil
}

// OlderPayload reports whether payload, of a task of kind, has a version v
// older than the version want this build reads the kind at: an older kiln
// queued it, this build's workers refuse it (versionMsg), and 'sched retry'
// would queue the same payload again.
func OlderPayload(kind string, payload []byte) (v, want int, older bool) {
	var env envelope
	if err := json.Unmarshal(payload, &env); err != nil {
		return 0, 0, false
	}
	p, ok := PolicyFor(kind)
	return env.V, p.Version, ok && env.V > 0 && env.V < p.Version
}

// versionMsg says that a payload of version v is not read by a build that
// reads version want, and what to do. Work an older kiln queued is queued
// again by the command that queued it, at this build's version, once the
// workers of the older build that sched status marks are upgraded (one
// left serving a queue queues the old version again: an ingest's shards
// queue its appends): sched retry would queue the same old payload. Work
// a newer kiln queued runs once this worker is upgraded. Its remedy and
// the task's kind fit the 200 characters sched runs shows of an error.
func versionMsg(v, want int) string {
	if v < want {
		return fmt.Sprintf("payload version %d is not read by this build (it reads %d): an older kiln queued it; upgrade the workers sched status marks, then sched enqueue the work again (not sched retry)", v, want)
	}
	return fmt.Sprintf("payload version %d is not read by this build (it reads %d): a newer kiln queued it; upgrade this worker to that kiln, then 'sched retry' the task", v, want)
}

// TaskID derives a task's id from its kind and content, so enqueuing the
// same work twice finds the first task instead of adding a second. The
// hash covers the encoded envelope, version included.
func TaskID(a Args) (string, error) {
	b, err := Encode(a)
	if err != nil {
		return "", err
	}
	return taskID(a.Kind(), b), nil
}

func taskID(kind string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(payload)
	return kind + ":" + hex.EncodeToString(h.Sum(nil)[:10])
}
