package segment

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// slowLists makes every listing of run's checkpoints through faults take
// longer than answer (a store that lists slowly: a large bucket, a loaded
// server): each is held until it has waited twice answer, then passed on.
// Each listing has a Hold rule of its own, added in advance, so that a
// listing that gave up (its client's bound ran out) lets no later one
// through. The rules are taken out when the test ends.
func slowLists(t *testing.T, faults *testsvc.S3Faults, run string, answer time.Duration) {
	t.Helper()
	const listings = 50 // far more than a segment makes; a minute of retries of a store taken as down
	var rules []*testsvc.Fault
	for range listings {
		rules = append(rules, faults.Add(testsvc.Fault{Method: "GET", Query: "prefix=" + "checkpoints%2F" + run + "%2F", Action: testsvc.Hold, Count: 1}))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-done
		faults.Clear()
	})
	go func() {
		defer close(done)
		for i, r := range rules {
			// Only these rules act on GETs: the count is of the listings
			// held so far.
			for faults.Acted("GET ") <= i {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			// The listing arrived before it was counted: it has now
			// waited past answer, which a client bounded by answer does
			// not wait out.
			select {
			case <-stop:
				return
			case <-time.After(2 * answer):
			}
			close(r.Release)
		}
	}()
}

// A store whose every listing of the run's checkpoints takes longer than
// AnswerWithin is slow, not down. The run's last segment, which trains on
// from its disk as the listing at its start is not answered in time, gives
// the listing its uploads wait for ListWithin: it uploads its checkpoints
// and ends the run, where each listing failed at AnswerWithin, no
// checkpoint went up and the segment waited for the store for good.
func TestAStoreSlowToListTakesTheUploads(t *testing.T) {
	ctx := context.Background()
	through, faults, direct := faultyS3(t)
	rdb := newRedis(t)
	run := testRun("slowlist", 8)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v, %v; want step 4 uploaded", out, err)
	}
	const answer = 50 * time.Millisecond
	slowLists(t, faults, "slowlist", answer)
	type result struct {
		out Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a", AnswerWithin: answer})
		done <- result{out, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		// Minutes: the segment is done in seconds once a listing is let
		// through; a store taken as down holds it for good.
		t.Fatal("the run's last segment still waits for the store after 3 minutes, its every listing answered")
	}
	if r.err != nil || !r.out.Done || r.out.ResumeSource != "local" || r.out.ResumedFrom != 4 || r.out.Uploaded != 8 {
		t.Fatalf("last segment: %+v, %v; want it to train on from the local step 4, upload step 8 and end the run", r.out, r.err)
	}
	if n := faults.Acted("GET "); n < 2 {
		t.Fatalf("%d listings held; want the one at the start and the uploads' at least", n)
	}
	if steps, err := RemoteSteps(ctx, direct, "slowlist"); err != nil || !slices.Contains(steps, 8) {
		t.Fatalf("object storage holds steps %v (%v); want step 8", steps, err)
	}
}

// A segment that has no checkpoint on its disk to train on from (a new
// machine) gives a store slow to list the run's checkpoints ListWithin,
// not AnswerWithin, and resumes from the newest in object storage, where
// it took the store as down and waited for it on every try.
func TestASegmentWithoutALocalCheckpointWaitsForASlowListing(t *testing.T) {
	ctx := context.Background()
	through, faults, _ := faultyS3(t)
	rdb := newRedis(t)
	run := testRun("newdisk", 8)
	run.Segment.MaxSteps = 4
	if out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v, %v; want step 4 uploaded", out, err)
	}
	const answer = 50 * time.Millisecond
	slowLists(t, faults, "newdisk", answer)
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-b", AnswerWithin: answer})
	if err != nil || out.ResumeSource != "object storage" || out.ResumedFrom != 4 || !out.Done || out.Uploaded != 8 {
		t.Fatalf("segment on a new disk: %+v, %v; want it to resume from step 4 in object storage and end the run", out, err)
	}
	if n := faults.Acted("GET "); n < 1 {
		t.Fatalf("%d listings held; want the one at the start at least", n)
	}
}
