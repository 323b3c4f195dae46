package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// lease is a Pipeline.Lease that a test moves: a worker's claim on the
// append queue, renewed (live) or last confirmed a while ago (passed).
type lease struct {
	mu    sync.Mutex
	until time.Time
}

func (l *lease) Until() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.until
}

func (l *lease) set(until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.until = until
}

func (l *lease) live()   { l.set(time.Now().Add(time.Hour)) }
func (l *lease) passed() { l.set(time.Now().Add(-time.Second)) }

// objectBytes is the object key's content, or nil where there is none.
func objectBytes(t *testing.T, objects store.Store, key string) []byte {
	t.Helper()
	r, err := objects.Get(context.Background(), key)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantLeaseError fails unless err is a LeaseError of store name for the
// write what, whose message says what happened and what becomes of it.
func wantLeaseError(t *testing.T, err error, name, what string, says ...string) {
	t.Helper()
	var le *LeaseError
	if !errors.As(err, &le) || le.Store != name || le.Write != what {
		t.Fatalf("err = %v; want a LeaseError for token store %s (%s)", err, name, what)
	}
	for _, want := range append([]string{"token store " + name, "did not " + what, "claim on the append queue was last confirmed in Redis",
		"may have lapsed because Redis does not answer", "another disk's worker may serve append now"}, says...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
}

// An append whose worker's lease has passed commits the shard to the
// store on its disk and publishes nothing: the status in object storage
// stays as it was, byte for byte, and the shard stays there too. Run
// again once the lease is renewed, the append finds the shard committed,
// publishes the status of a store that holds every document once, and
// deletes the shard.
func TestAnAppendWhoseLeasePassedPublishesNoStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tok := testTokenizer(t)
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": tok})
	var all []string
	for f := range 2 {
		var rows []textRow
		for d := range 4 {
			rows = append(rows, textRow{Text: fmt.Sprintf("file %d doc %d: func main() { println(%d) }", f, d, d)})
			all = append(all, rows[d].Text)
		}
		h.Add(corpusRepo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, rows), true)
	}
	l := &lease{}
	l.live()
	p.Lease = l.Until
	const name = "code"
	plan, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "t", Seed: 1})
	if err != nil || len(plan.Shards) != 2 {
		t.Fatalf("plan: %+v, %v", plan, err)
	}
	var jobs []AppendJob
	for _, sj := range plan.Shards {
		j, done, err := p.Shard(ctx, sj, nil)
		if err != nil || done || j.Object == "" {
			t.Fatalf("shard of %s: %+v, %v, %v", sj.Path, j, done, err)
		}
		jobs = append(jobs, j)
	}
	if _, err := p.Append(ctx, jobs[0], nil); err != nil {
		t.Fatal(err)
	}
	before := objectBytes(t, p.Objects, StatusKey(name))
	if before == nil {
		t.Fatal("the first append published no status")
	}

	// Redis has not answered the claim's renewals for a while.
	l.passed()
	_, err = p.Append(ctx, jobs[1], nil)
	wantLeaseError(t, err, name, "publish its status", "the append is retried", "nothing stored is lost")
	if after := objectBytes(t, p.Objects, StatusKey(name)); !bytes.Equal(after, before) {
		t.Fatalf("an append whose lease passed changed the status:\n before %s\n after  %s", before, after)
	}
	if objectBytes(t, p.Objects, jobs[1].Object) == nil {
		t.Fatalf("the shard %s was deleted, though no status says the store holds it", jobs[1].Object)
	}
	dir := filepath.Join(p.StoresDir, name)
	if m, err := tokens.ReadManifest(dir); err != nil || !m.Input(jobs[1].ShardID).Whole {
		t.Fatalf("the store on this disk does not hold the shard the refused append committed: %v", err)
	}

	// The claim renewed, the append's retry.
	l.live()
	res, err := p.Append(ctx, jobs[1], nil)
	if err != nil || !res.Duplicate {
		t.Fatalf("the append run again: %+v, %v; want the shard found in the store", res, err)
	}
	st, err := p.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{jobs[0].ShardID, jobs[1].ShardID}
	slices.Sort(ids)
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Done, ids) || st.Documents != int64(len(all)) || st.Tokens != m.Tokens || st.Shards != 2 {
		t.Fatalf("the status after the retry: %+v; want both files done, %d documents, the store's %d tokens", st, len(all), m.Tokens)
	}
	sameDocs(t, storeDocs(t, tok, dir, all), all)
	if objectBytes(t, p.Objects, jobs[1].Object) != nil {
		t.Fatalf("the shard %s is left in object storage after its status was published", jobs[1].Object)
	}
}

// Where the lease passes between an append's status and its deletion of
// the shard, the shard stays: the deletion says the store holds it, which
// only the disk of the worker that serves append may say. The append run
// again deletes it.
func TestAShardIsNotDeletedOnceTheLeasePassed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	objects := versityObjects(t, testsvc.S3(t))
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	l := &lease{}
	l.live()
	// The lease passes as soon as the status is published: the next
	// write, the shard's deletion, finds it passed.
	published := &afterPut{Store: objects, key: StatusKey("code"), then: l.passed}
	p := &Pipeline{Objects: published, StoresDir: t.TempDir(), Lease: l.Until}
	b := tokens.Encode(nil, tokens.Uint16, append(tok.Encode("func main() {}"), eos))
	key := ShardObject("code", "owner/corpus/data/a.parquet")
	if err := objects.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	job := AppendJob{Store: "code", ShardID: "owner/corpus/data/a.parquet", Object: key, Source: "data/a.parquet", Documents: 1, Tokens: int64(len(b) / 2),
		Tokenizer: tokens.Tokenizer{Name: "t", SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}}
	_, err := p.Append(ctx, job, nil)
	wantLeaseError(t, err, "code", "delete its appended shard "+key, "the shard stays in object storage")
	if objectBytes(t, objects, key) == nil {
		t.Fatal("the shard was deleted after the lease passed")
	}
	l.live()
	if res, err := p.Append(ctx, job, nil); err != nil || !res.Duplicate {
		t.Fatalf("the append run again: %+v, %v", res, err)
	}
	if objectBytes(t, objects, key) != nil {
		t.Fatal("the append run again left the shard in object storage")
	}
}

// afterPut is a store that runs then once, after the first put of key
// that succeeded.
type afterPut struct {
	store.Store
	key  string
	then func()
	once sync.Once
}

func (a *afterPut) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	err := a.Store.Put(ctx, key, r, size)
	if err == nil && key == a.key {
		a.once.Do(a.then)
	}
	return err
}

// A status write that object storage holds up is cut off at the lease: it
// cannot land after it, when another disk's worker may have claimed the
// append queue. The append says so, and the status stays as it was.
func TestAStatusWriteIsCutOffAtTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.S3(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	// held gets each put of a status, which the proxy holds until the
	// client gives it up, or, should it never, until the test ends; it
	// then forwards it, as a slow network would deliver it late.
	held := make(chan struct{}, 1)
	release := make(chan struct{})
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/status.json") {
			select {
			case held <- struct{}{}:
			default:
			}
			select {
			case <-r.Context().Done():
				return
			case <-release:
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	t.Cleanup(func() { close(release) })
	objects, err := store.NewS3(store.S3Options{Endpoint: strings.TrimPrefix(proxy.URL, "http://"), Bucket: "kiln",
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	// The lease is two seconds ahead whenever it is asked, so that the
	// status write, however late the append reaches it, starts under a
	// live lease and must land within two seconds.
	var mu sync.Mutex
	var until time.Time
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir(), Lease: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		until = time.Now().Add(2 * time.Second)
		return until
	}}
	job := AppendJob{Store: "code", ShardID: "owner/corpus/data/bad.parquet", Source: "data/bad.parquet", SkipReason: SkipCorruptFile, SkipMessage: "not parquet",
		Tokenizer: tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300}}
	done := make(chan error, 1)
	go func() {
		_, err := p.Append(ctx, job, nil)
		done <- err
	}()
	select {
	case <-held:
	case err := <-done:
		t.Fatalf("the append ended before it published its status: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("waited a minute for the append to publish its status")
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the status write held up by object storage was not cut off at the lease: waited a minute")
	}
	mu.Lock()
	asked := until
	mu.Unlock()
	if time.Now().Before(asked) {
		t.Fatalf("the append ended before its lease (%v) did: %v", asked, err)
	}
	wantLeaseError(t, err, "code", "publish its status", "the write was cut off at", "the append is retried")
	direct := versityObjects(t, srv)
	if b := objectBytes(t, direct, StatusKey("code")); b != nil {
		t.Fatalf("a status landed: %s", b)
	}
}

// Statuses are mended only while the lease lasts: with it passed, neither
// the status of a store gone from this disk is cleared nor that of a
// store that holds more than it says rewritten, at the start
// (ReconcileStatuses) or by the watch, and the error names each store and
// why; renewed, the watch's next look mends them.
func TestStatusesAreNotMendedOnceTheLeasePassed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	objects := versityObjects(t, testsvc.S3(t))
	l := &lease{}
	l.live()
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir(), Lease: l.Until}
	fill := func(name string, publish bool, ids ...string) { fillStore(t, p, name, publish, ids...) }
	fill("gone", true, "a", "b")
	fill("behind", true, "a")
	fill("behind", false, "b") // copied here, say, with no append to publish it
	w := p.WatchStores()
	if err := os.RemoveAll(filepath.Join(p.StoresDir, "gone")); err != nil {
		t.Fatal(err)
	}
	before := map[string][]byte{}
	for _, name := range []string{"gone", "behind"} {
		before[name] = objectBytes(t, objects, StatusKey(name))
	}
	unchanged := func(when string) {
		t.Helper()
		for name, b := range before {
			if after := objectBytes(t, objects, StatusKey(name)); !bytes.Equal(after, b) {
				t.Fatalf("%s: the status of %s changed:\n before %s\n after  %s", when, name, b, after)
			}
		}
	}

	l.passed()
	rs, err := p.ReconcileStatuses(ctx)
	if len(rs) != 0 {
		t.Fatalf("ReconcileStatuses with its lease passed mended %+v", rs)
	}
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	if len(errs) != 2 {
		t.Fatalf("ReconcileStatuses with its lease passed: %v; want an error for each of the two stores", err)
	}
	wantLeaseError(t, errs[0], "behind", "publish its status", "the status is left as it was")
	wantLeaseError(t, errs[1], "gone", "clear its status", "the status is left as it was")
	unchanged("ReconcileStatuses")
	rs, err = w.Check(ctx)
	if len(rs) != 0 || err == nil || !strings.Contains(err.Error(), "token store gone: did not clear its status") {
		t.Fatalf("the watch with its lease passed: mended %+v, %v; want none, and why", rs, err)
	}
	unchanged("the watch")

	l.live()
	if rs, err := w.Check(ctx); err != nil || len(rs) != 1 || rs[0].Store != "gone" {
		t.Fatalf("the watch's next look with the lease renewed: mended %+v, %v; want the store that went", rs, err)
	}
	if rs, err := p.ReconcileStatuses(ctx); err != nil || len(rs) != 1 || rs[0].Store != "behind" {
		t.Fatalf("ReconcileStatuses with the lease renewed: mended %+v, %v; want the store behind its status", rs, err)
	}
	for name, want := range map[string]string{"gone": "", "behind": "a,b"} {
		st, err := p.Status(ctx, name)
		if err != nil || strings.Join(st.Done, ",") != want {
			t.Errorf("the status of %s: %+v, %v; want it to list %q", name, st, err, want)
		}
	}
}

// versityObjects is the bucket kiln of the test's versitygw srv.
func versityObjects(t *testing.T, srv *testsvc.S3Server) store.Store {
	t.Helper()
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return objects
}

// An append whose object is not a shard of its store (a task written into
// Redis by hand or by a bug: no plan makes one) is refused as the user's to
// fix, not retried, before it reads or deletes anything: the object stays,
// and the store is not made.
func TestAnAppendOfAnObjectOutsideItsStoresShardsIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tok := testTokenizer(t)
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": tok})
	h.Add(corpusRepo, "data/part-0.parquet", parquetBytes(t, []textRow{{Text: "func main() {}"}}), true)
	plan, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 1})
	if err != nil || len(plan.Shards) != 1 {
		t.Fatalf("plan: %+v, %v", plan, err)
	}
	j, _, err := p.Shard(ctx, plan.Shards[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	const other = "checkpoints/run/step-0000100/model.safetensors"
	if err := p.Objects.Put(ctx, other, bytes.NewReader(objectBytes(t, p.Objects, j.Object)), int64(len(objectBytes(t, p.Objects, j.Object)))); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"../../../../etc/passwd", other, ShardPrefix("another") + "x.tokens"} {
		bad := j
		bad.Object = key
		_, err := p.Append(ctx, bad, nil)
		var be interface{ BadInput() bool }
		if err == nil || !errors.As(err, &be) || !be.BadInput() || !strings.Contains(err.Error(), "which is not a shard of token store code") {
			t.Fatalf("an append of %q: %v; want it refused as bad input", key, err)
		}
	}
	if objectBytes(t, p.Objects, other) == nil {
		t.Fatal("the refused append deleted the object it named")
	}
	if _, err := os.Stat(filepath.Join(p.StoresDir, "code")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the refused appends made the store (%v)", err)
	}
	if _, err := p.Append(ctx, j, nil); err != nil {
		t.Fatalf("the shard's own append: %v", err)
	}
}
