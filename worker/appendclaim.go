package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/lapse"
	"github.com/kiln-lm/kiln/internal/redismem"
)

// The append queue has one consumer host (scheduler.QueueAppend): the
// token stores are files on the disk of the worker that appends them. A
// second machine serving it too would append half the shards to stores of
// its own, and its start would clear, in object storage, the status of
// every store its disk lacks (ReconcileStores), so that runs see stores
// that hold nothing. asynq binds no queue to a host, so a worker that
// serves append first claims it for its data directory in Redis, and a
// worker of another directory is refused while the claim holds. Workers of
// one directory share the claim: they share the stores, whose appends are
// serialised by the stores' own file locks.

// AppendClaimKey is the Redis hash that names the data directory whose
// workers serve the append queue: its disk id, and the host, directory,
// pid and claim TTL of the worker that renewed it last.
const AppendClaimKey = "kiln:append:owner"

// DefaultAppendClaimTTL is how long a claim outlives the last renewal of
// its worker. A claim is renewed every third of it, so a Redis that stalls
// for a few seconds does not lose it; and a machine gone for good holds
// the queue this long before another may serve it.
const DefaultAppendClaimTTL = 30 * time.Second

// DiskIDFile is the file, in a data directory, that holds its disk id.
// It lies beside tokens/, not in it: a backup of the stores copied onto
// another machine (docs/operations.md, the lost disk) must not carry the
// identity of the disk it came from, or that machine would pass for the
// first one and be let serve append beside it.
const DiskIDFile = "disk-id"

// DiskID returns the id of the data directory dataDir: a random id made
// at its first use and kept in DiskIDFile, which every worker of the
// directory reads. Two workers that start at once on a new directory get
// the same id.
func DiskID(dataDir string) (string, error) {
	p := filepath.Join(dataDir, DiskIDFile)
	id, err := readDiskID(p)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return "", fmt.Errorf("make the data directory %s: %w", dataDir, err)
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("draw a disk id for %s: %w", dataDir, err)
	}
	tmp, err := os.CreateTemp(dataDir, "."+DiskIDFile+".*")
	if err != nil {
		return "", fmt.Errorf("write the disk id of %s: %w", dataDir, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(hex.EncodeToString(b[:]) + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("write the disk id of %s: %w", dataDir, err)
	}
	// A link, unlike a rename, replaces nothing: of two workers making the
	// id at once, the second finds the first's and reads it, where a
	// rename would leave each with its own id and the second refused.
	if err := os.Link(tmp.Name(), p); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("write the disk id of %s: %w", dataDir, err)
	}
	return readDiskID(p)
}

func readDiskID(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read the disk id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if _, err := hex.DecodeString(id); err != nil || len(id) != 32 {
		if len(id) > 40 {
			id = id[:40] + "..."
		}
		return "", fmt.Errorf("%s holds %q, not a disk id (32 hex digits): delete it, and a worker's next start makes a new one", p, id)
	}
	return id, nil
}

// AppendHolder is the worker that holds the append claim, as its hash in
// Redis says.
type AppendHolder struct {
	Disk string // the disk id of its data directory
	Host string
	Dir  string // its data directory, absolute
	PID  int
	// TTL is how long its claim outlives it (0: not said).
	TTL time.Duration
}

func (h AppendHolder) String() string {
	return fmt.Sprintf("host %s, data directory %s (pid %d)", h.Host, h.Dir, h.PID)
}

// AppendClaimedError is ClaimAppend's answer when the workers of another
// data directory serve the append queue.
type AppendClaimedError struct {
	Holder AppendHolder
	// Dir and Host are the data directory that was refused and its host.
	Dir, Host string
}

func (e *AppendClaimedError) Error() string {
	ttl := e.Holder.TTL
	if ttl <= 0 {
		ttl = DefaultAppendClaimTTL
	}
	return fmt.Sprintf("the append queue is served by the worker on %s, whose disk holds the token stores (Redis key %s); "+
		"this worker's data directory, %s on host %s, is another disk: serve append from one machine (the one whose disk holds the token stores, the GPU worker's); "+
		"start more workers elsewhere with --queues ingest=N; if that worker is gone for good, wait for its claim to lapse (%s after it stopped) "+
		"and start this one again, with a copy of that machine's <data dir>/tokens if you have one (docs/operations.md, \"Scaling the workers\")",
		e.Holder, AppendClaimKey, e.Dir, e.Host, ttl)
}

// BadInput marks the refusal as the caller's to fix: the command exits 2.
func (e *AppendClaimedError) BadInput() bool { return true }

// AppendClaimParams configures ClaimAppend. Zero values take the defaults
// noted.
type AppendClaimParams struct {
	// Redis is the queue's Redis (required).
	Redis redis.UniversalClient
	// DataDir is the worker's data directory, whose tokens/ holds the
	// stores (required).
	DataDir string
	// TTL is how long the claim outlives this worker's last renewal.
	// Default DefaultAppendClaimTTL.
	TTL time.Duration
	// Logger receives the renewals' failures and the claim's loss.
	// Default zap.NewNop().
	Logger *zap.Logger
}

// AppendClaim is a worker's hold on the append queue: renewed every TTL/3
// until Close, and lost, once and for good, when a renewal finds another
// disk's claim in its place.
type AppendClaim struct {
	p    AppendClaimParams
	me   AppendHolder
	stop context.CancelFunc
	done chan struct{}
	// remade is sent on, without blocking, each time a renewal finds the
	// claim gone and makes it again (Remade).
	remade chan struct{}

	mu       sync.Mutex
	lostCh   chan struct{}
	lostTo   AppendHolder
	failures lapse.Lapse
	// renewal is the last renewal's error; nil where it succeeded
	// (RenewalError).
	renewal error
	// until is when the claim may lapse at the earliest, as its last
	// confirmation says (Until); zero once the claim is lost.
	until time.Time
}

// untilMargin is what Until takes off the TTL: the claim's hash lapses a
// TTL after Redis ran the renewal, by Redis's clock, and this worker
// counts from before it sent the renewal, by its own. A sixth of the TTL
// (5 s of the default 30 s) covers clocks that run at rates that differ
// by far more than any machine's do, and the write to object storage that
// starts just before Until and must have landed when another disk's
// worker may claim the queue.
func untilMargin(ttl time.Duration) time.Duration { return ttl / 6 }

// claimScript claims KEYS[1] for the disk ARGV[1], or renews its claim,
// writing this worker (ARGV[2..4]) into it with a lease of ARGV[5] ms. A
// claim of another disk is left alone. It returns {2} for a claim made
// where there was none, {1} for a claim renewed, and {0, the holder's
// fields} for another disk's.
var claimScript = redis.NewScript(`
local disk = redis.call('HGET', KEYS[1], 'disk')
if disk and disk ~= ARGV[1] then
  return {0, redis.call('HGETALL', KEYS[1])}
end
redis.call('HSET', KEYS[1], 'disk', ARGV[1], 'host', ARGV[2], 'dir', ARGV[3], 'pid', ARGV[4], 'ttl_ms', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
if disk then return {1} end
return {2}
`)

// ClaimAppend claims the append queue for p.DataDir's disk, or joins the
// claim the workers of that directory hold, and keeps renewing it until
// Close. Where another data directory holds it, it returns an
// *AppendClaimedError naming its worker. A worker runs it before anything
// that touches the stores' statuses.
func ClaimAppend(ctx context.Context, p AppendClaimParams) (*AppendClaim, error) {
	if p.Redis == nil {
		return nil, errors.New("worker: AppendClaimParams.Redis is required")
	}
	if p.DataDir == "" {
		return nil, errors.New("worker: AppendClaimParams.DataDir is required")
	}
	if p.TTL <= 0 {
		p.TTL = DefaultAppendClaimTTL
	}
	if p.TTL < 30*time.Millisecond {
		return nil, fmt.Errorf("worker: AppendClaimParams.TTL %v is too short to renew", p.TTL)
	}
	if p.Logger == nil {
		p.Logger = zap.NewNop()
	}
	dir, err := filepath.Abs(p.DataDir)
	if err != nil {
		return nil, fmt.Errorf("claim the append queue: %w", err)
	}
	id, err := DiskID(dir)
	if err != nil {
		return nil, fmt.Errorf("claim the append queue: %w", err)
	}
	host, _ := os.Hostname()
	c := &AppendClaim{p: p, me: AppendHolder{Disk: id, Host: host, Dir: dir, PID: os.Getpid(), TTL: p.TTL}, lostCh: make(chan struct{}), done: make(chan struct{}), remade: make(chan struct{}, 1)}
	sent := time.Now()
	made, other, err := c.hold(ctx)
	if err != nil {
		return nil, fmt.Errorf("claim the append queue for data directory %s in Redis: %w", dir, err)
	}
	if other != nil {
		return nil, &AppendClaimedError{Holder: *other, Dir: dir, Host: host}
	}
	c.confirmed(sent)
	if made {
		p.Logger.Info("append queue claimed for this data directory", zap.String("dir", dir), zap.String("disk_id", id), zap.Duration("ttl", p.TTL))
	} else {
		p.Logger.Info("append queue already claimed for this data directory: served with its other workers", zap.String("dir", dir), zap.String("disk_id", id))
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	go c.keepAlive(rctx)
	return c, nil
}

// Disk is the disk id the claim is for.
func (c *AppendClaim) Disk() string { return c.me.Disk }

// Lost is closed once another disk's claim has replaced this one.
func (c *AppendClaim) Lost() <-chan struct{} { return c.lostCh }

// Remade receives once a renewal has found the claim gone from Redis
// and made it again (one value for any number of such renewals not yet
// received). Another disk's worker may have held the claim in the gap,
// and made the stores' statuses say what its disk holds: the stores'
// statuses are this disk's to mend again (ingest.StoresWatch.ReconcileLater).
func (c *AppendClaim) Remade() <-chan struct{} { return c.remade }

// LostTo is the worker whose claim replaced this one, once Lost is closed.
func (c *AppendClaim) LostTo() AppendHolder {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lostTo
}

// Until is the time up to which the claim surely holds: no worker of
// another disk can have claimed the append queue before it. It is a TTL,
// less a margin for clocks and for the write that follows (untilMargin),
// after the last renewal that Redis confirmed was sent, and it stops
// advancing while Redis does not answer; zero once the claim is lost. A
// worker checks it before each write to object storage that speaks for
// the stores on its disk (ingest.Pipeline.Lease): once it has passed,
// another disk's worker may serve append and have made the stores'
// statuses say what its own disk holds. After Close it stays where the
// last renewal left it, which the claim in Redis outlives.
func (c *AppendClaim) Until() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.until
}

// RenewalError is the error of the claim's last renewal, which says why
// Until stopped advancing (Redis not answering, or full); nil where the
// last renewal succeeded.
func (c *AppendClaim) RenewalError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.renewal
}

// confirmed records a renewal (or the first claim) sent at sent that
// Redis confirmed: Redis set the claim's expiry after that time, so the
// claim holds at least a TTL from it.
func (c *AppendClaim) confirmed(sent time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.lostCh:
		return // lost for good: no renewal brings it back
	default:
	}
	if u := sent.Add(c.p.TTL - untilMargin(c.p.TTL)); u.After(c.until) {
		c.until = u
	}
}

// Close stops renewing the claim. It is left in Redis to lapse after its
// TTL, not deleted: the other workers of this directory, which renew the
// same claim, may still serve append, and a deletion would let another
// disk claim it between their renewals. Moving the queue to another
// machine therefore waits out one TTL.
func (c *AppendClaim) Close() {
	c.stop()
	<-c.done
}

// hold runs claimScript: made says the claim was absent and is now this
// disk's, other names the worker of another disk that holds it.
func (c *AppendClaim) hold(ctx context.Context) (made bool, other *AppendHolder, err error) {
	res, err := claimScript.Run(ctx, c.p.Redis, []string{AppendClaimKey},
		c.me.Disk, c.me.Host, c.me.Dir, c.me.PID, c.p.TTL.Milliseconds()).Slice()
	if err != nil {
		return false, nil, err
	}
	code, _ := res[0].(int64)
	if code != 0 {
		return code == 2, nil, nil
	}
	if len(res) != 2 {
		return false, nil, fmt.Errorf("the claim's script answered %v", res)
	}
	fields, _ := res[1].([]any)
	h := AppendHolder{}
	for i := 0; i+1 < len(fields); i += 2 {
		k, _ := fields[i].(string)
		v, _ := fields[i+1].(string)
		h.set(k, v)
	}
	return false, &h, nil
}

// AppendHolderNow is the worker that holds the append claim, or nil where
// none does (no worker serves append, or its claim lapsed).
func AppendHolderNow(ctx context.Context, rdb redis.UniversalClient) (*AppendHolder, error) {
	m, err := rdb.HGetAll(ctx, AppendClaimKey).Result()
	if err != nil || len(m) == 0 {
		return nil, err
	}
	h := &AppendHolder{}
	for k, v := range m {
		h.set(k, v)
	}
	return h, nil
}

// set reads field k of the claim's hash.
func (h *AppendHolder) set(k, v string) {
	switch k {
	case "disk":
		h.Disk = v
	case "host":
		h.Host = v
	case "dir":
		h.Dir = v
	case "pid":
		h.PID, _ = strconv.Atoi(v)
	case "ttl_ms":
		ms, _ := strconv.ParseInt(v, 10, 64)
		h.TTL = time.Duration(ms) * time.Millisecond
	}
}

// keepAlive renews the claim every TTL/3. A renewal that does not reach
// Redis is tried again at the next tick: while Redis does not answer, the
// worker takes no task of any queue either. One that finds the claim gone
// (Redis lost its data, or did not answer for a whole TTL) claims it again
// where no other disk has; one that finds another disk's claim marks this
// one lost and stops.
func (c *AppendClaim) keepAlive(ctx context.Context) {
	defer close(c.done)
	every := c.p.TTL / 3
	t := time.NewTicker(every)
	defer t.Stop()
	log := c.p.Logger.With(zap.String("dir", c.me.Dir), zap.String("disk_id", c.me.Disk))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		// Taken before the request goes out: Redis sets the expiry at
		// some moment after it.
		sent := time.Now()
		made, other, err := c.hold(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil && other == nil {
			c.confirmed(sent)
		}
		c.mu.Lock()
		c.renewal = err
		c.mu.Unlock()
		first, back := c.failures.Note(err)
		switch {
		case first && redismem.Refused(err):
			// Redis answers: the worker's line that it refuses writes
			// says what to do.
			log.Warn(fmt.Sprintf("append claim not renewed: Redis refuses writes because it is full (its maxmemory reached); the worker tries again every %s, and once the claim has gone unrenewed for %s another disk's worker may claim append as soon as Redis takes writes again", every, c.p.TTL),
				zap.Error(err))
		case first:
			log.Warn(fmt.Sprintf("append claim not renewed: Redis does not answer; the worker tries again every %s, and another disk's worker may claim append once the claim has gone unrenewed for %s", every, c.p.TTL),
				zap.Error(err))
		case err != nil:
		case other != nil:
			c.markLost(*other, log)
			return
		case made:
			log.Warn("append claim was gone from Redis (Redis lost its data, or it lapsed while Redis did not answer or refused writes) and no other disk held it: claimed again; "+
				"the stores' statuses are made to say what this disk holds again, as at a start",
				zap.Int("renewals_failed", back))
			select {
			case c.remade <- struct{}{}:
			default:
			}
		case back > 0:
			log.Info("append claim renewed again", zap.Int("renewals_failed", back))
		}
	}
}

func (c *AppendClaim) markLost(to AppendHolder, log *zap.Logger) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lostTo = to
	c.until = time.Time{}
	log.Error("append claim lost: the worker on "+to.String()+" claimed the append queue after this one's claim was gone from Redis "+
		"(Redis lost its data, or did not answer or refused writes for "+c.p.TTL.String()+"). This worker stops serving append and re-queues the appends it runs; "+
		"the token stores of the two disks may now differ. Serve append from one machine: stop that worker (start it again with --queues ingest=N), "+
		"then, once its claim has lapsed ("+c.p.TTL.String()+"), restart this one, whose start makes the stores' statuses say what this disk holds",
		zap.String("holder_host", to.Host), zap.String("holder_dir", to.Dir), zap.Int("holder_pid", to.PID), zap.String("holder_disk_id", to.Disk))
	close(c.lostCh)
}
