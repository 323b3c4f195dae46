package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// A worker that serves append speaks for the stores on its disk only
// while its claim on the append queue surely holds: the handlers it makes
// take the claim's lease, so that its start's mending of the statuses,
// and its store watch's, write nothing once the lease has passed (another
// disk's worker may serve append and have made the statuses say what its
// disk holds). With a live lease the same start clears the status of a
// store its disk lacks, as ever.
func TestAWorkerMendsNoStatusOnceItsClaimMayHaveLapsed(t *testing.T) {
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	data := t.TempDir()
	objects, err := store.NewLocal(filepath.Join(data, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	// The status of a store this disk does not hold.
	status := putElsewhere(t, objects)

	cfg := scheduler.Config{RedisURL: r.URL(0), DataDir: data}.WithDefaults()
	opt, _ := asynq.ParseRedisURI(cfg.RedisURL)
	q := scheduler.NewClient(opt)
	defer q.Close()
	queues := map[string]int{scheduler.QueueAppend: 1}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()

	passed := func() time.Time { return time.Now().Add(-time.Second) }
	core, logs := observer.New(zap.WarnLevel)
	hs, err := workerHandlers(wctx, cfg, queues, q, zap.New(core), passed)
	if err != nil {
		t.Fatal(err)
	}
	if !status() {
		t.Fatal("a worker whose lease had passed cleared a store's status at its start")
	}
	if said := logs.FilterMessageSnippet("statuses not checked against this disk").All(); len(said) != 1 || !strings.Contains(fmt.Sprint(said[0].ContextMap()["error"]), "elsewhere") {
		t.Fatalf("the start refused by the lease logged %v; want one warning naming the store", logs.All())
	}
	// The store's directory comes, empty: the watch would clear the
	// status, and may not.
	if err := os.MkdirAll(filepath.Join(data, "tokens", "elsewhere"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Refused by the lease as the start was: an error said once already.
	var lapsed *ingest.LeaseError
	if rs, err := hs.Ingest.Stores.Check(ctx); len(rs) != 0 || (err != nil && !errors.As(err, &lapsed)) || !status() {
		t.Fatalf("the watch with the lease passed: mended %+v, %v; want nothing mended, no error but the lease's, the status there", rs, err)
	}
	if rs := hs.Ingest.ReconcileStores(ctx, zap.NewNop()); len(rs) != 0 || !status() {
		t.Fatalf("with the lease passed, mending the statuses again mended %+v; the status is there: %v", rs, status())
	}

	live := func() time.Time { return time.Now().Add(time.Hour) }
	if _, err := workerHandlers(wctx, cfg, queues, q, zap.NewNop(), live); err != nil {
		t.Fatal(err)
	}
	if status() {
		t.Fatal("a worker whose lease holds left the status of a store its disk lacks")
	}
}
