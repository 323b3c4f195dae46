package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// The token stores are files on the disk of the one worker that serves
// append, and its claim on the append queue in Redis (worker.ClaimAppend)
// is its right to speak for them in object storage. A worker cut off from
// Redis, and not from object storage, keeps appending while its claim
// lapses; another disk's worker may then claim the queue and make every
// status say what its own disk holds. Were the first worker to publish a
// status after that, the status would name files the serving disk lacks,
// and plans would skip them for good. So each write of the appending side
// that speaks for the stores (a status published or cleared, an appended
// shard deleted) checks the claim's lease first (Pipeline.Lease) and runs
// under a context that ends with it: it is refused once the claim may
// have lapsed, and one that runs late is cut off rather than landing
// after the lease.
//
// A refusal leaves the store consistent. An append commits to the store
// on this disk before it publishes the status, and deletes the shard
// only after, so a refused write leaves what a worker lost between the
// commit and the publish leaves, which an append run again already mends:
// it finds the shard committed (AppendResult.Duplicate), appends nothing,
// publishes the status and deletes the shard. A store's refusal record
// (RefusalKey) needs no lease: the plans and shards of any worker write
// it, not the appending side, and it says nothing of what a disk holds.

// LeaseError is a write for a token store that the appending side did not
// make, or cut off, because this worker's claim on the append queue may
// have lapsed (Pipeline.Lease).
type LeaseError struct {
	Store string
	// Write is what was not done: "publish its status", say.
	Write string
	// Until is when the lease ended, as the claim's last renewal that
	// Redis confirmed set it; zero: the claim was lost to another disk.
	Until time.Time
	// Err is the write's own error, where the lease ended while it ran.
	Err error
	// Renewal is the error of the claim's last renewal, where the worker
	// that holds the claim gave it: why the lease was not renewed. Nil:
	// Redis did not answer, as far as this error knows.
	Renewal error
	// Then says what becomes of the write: by default, the append that
	// made it is retried.
	Then string
}

// appendRetried is LeaseError.Then's default.
const appendRetried = "the append is retried, and nothing stored is lost: the store on this disk keeps what it committed, " +
	"and the shard stays in object storage until a worker whose claim holds has published the status of a store that holds it"

func (e *LeaseError) Error() string {
	why := "this worker's claim on the append queue was lost: another disk's worker serves append now"
	if !e.Until.IsZero() {
		at := e.Until.UTC().Format("2006-01-02T15:04:05.000Z")
		why = "this worker's claim on the append queue was last confirmed in Redis to hold until " + at + ", which has passed"
		if e.Err != nil {
			why = fmt.Sprintf("the write was cut off at %s (%v), to which this worker's claim on the append queue was last confirmed in Redis to hold", at, e.Err)
		}
		if redismem.Refused(e.Renewal) {
			// Redis answers, and refuses writes: no other worker can claim
			// append until it takes them again either.
			why += ", and may have lapsed because Redis refuses its renewals, being full (its maxmemory reached): " +
				"another disk's worker may serve append once Redis takes writes again"
		} else {
			why += ", and may have lapsed because Redis does not answer its renewals: another disk's worker may serve append now"
		}
	}
	then := e.Then
	if then == "" {
		then = appendRetried
	}
	return fmt.Sprintf("token store %s: did not %s: %s, and this worker must not write over the statuses that one publishes; %s",
		e.Store, e.Write, why, then)
}

func (e *LeaseError) Unwrap() error { return e.Err }

// leased runs write, a write to object storage for the store name that
// says what the store holds, while p's lease lasts: not at all once it
// has passed, and under a context that ends with it.
func (p *Pipeline) leased(ctx context.Context, name, what string, write func(ctx context.Context) error) error {
	if p.Lease == nil {
		return write(ctx)
	}
	until := p.Lease()
	if !until.After(time.Now()) {
		return &LeaseError{Store: name, Write: what, Until: until}
	}
	lctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	err := write(lctx)
	if err != nil && ctx.Err() == nil && lctx.Err() != nil {
		return &LeaseError{Store: name, Write: what, Until: until, Err: err}
	}
	return err
}
