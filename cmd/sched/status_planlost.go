package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// storeStatusAge is how long `sched status --watch` keeps a store's status
// read from object storage while its files' tasks in Redis stay as they
// were: an append that commits changes them, all but one a worker held
// as Redis lost its data, whose commit Redis never records.
const storeStatusAge = 30 * time.Second

// storeStatuses caches the statuses object storage publishes of the stores
// whose plan Redis lost, for a --watch that redraws every 2 s: read again
// once their files' tasks in Redis change, or after storeStatusAge.
type storeStatuses struct {
	objects store.Store
	openErr error
	opened  time.Time
	read    map[string]storeStatusRead
}

type storeStatusRead struct {
	seen string // the files' tasks in Redis as they were at the read
	at   time.Time
	st   ingest.StoreStatus
	err  error
}

// planLost says of a store whose plan Redis no longer holds (d.NoPlan)
// what its line's counts are not, what the store holds by its status in
// object storage (which the append worker publishes after every commit,
// and which outlives Redis), and how to queue the files it lacks; and the
// error of the read of that status, if any (the line says it too).
func (c *storedCache) planLost(ctx context.Context, d scheduler.DatasetProgress) (string, error) {
	again := d.EnqueueAgain()
	why := "Redis holds no record of its plan (it lost its data, or the plan ended more than 7 days ago), so the dataset's file count is unknown"
	st, err := c.stores.status(ctx, c.cfg, d)
	switch {
	case err != nil:
		err = redactErr(c.cfg, err)
		return fmt.Sprintf("%s, and the store's status in object storage was not read (%v): 'sched datasets' says what the store holds; %s",
			why, scheduler.OneLine(err.Error(), 200), again), err
	case st == nil:
		return fmt.Sprintf("%s: 'sched datasets' says what the store holds; %s", why, again), nil
	}
	files := "files"
	if len(st.Done) == 1 {
		files = "file"
	}
	return fmt.Sprintf("%s: the store holds %s of %d %s, by its status in object storage; %s",
		why, formatCount(st.Tokens, "tok"), len(st.Done), files, again), nil
}

// status reads the store's status in object storage, or the one read
// before where it is still fresh; nil where no object storage is
// configured here, none having been used.
func (s *storeStatuses) status(ctx context.Context, cfg scheduler.Config, d scheduler.DatasetProgress) (*ingest.StoreStatus, error) {
	now := time.Now()
	seen := fmt.Sprintf("%d %d %d %d %d", d.Files, d.Done, d.Running, d.Failed, d.Tokens)
	if r, ok := s.read[d.Store]; ok && r.seen == seen && now.Sub(r.at) < storeStatusAge {
		return &r.st, r.err
	}
	if cfg.S3Endpoint == "" {
		if _, err := os.Stat(cfg.LocalStoreDir()); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	if s.objects == nil && (s.openErr == nil || now.Sub(s.opened) >= storeStatusAge) {
		// A store that does not answer holds one refresh for openStore's
		// check, not every one.
		s.objects, s.openErr = openStore(ctx, cfg)
		s.opened = now
	}
	if s.openErr != nil {
		return nil, s.openErr
	}
	st, err := (&ingest.Pipeline{Objects: s.objects}).Status(ctx, d.Store)
	if s.read == nil {
		s.read = map[string]storeStatusRead{}
	}
	s.read[d.Store] = storeStatusRead{seen: seen, at: now, st: st, err: err}
	return &st, err
}
