package ingest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// partProxy stands in front of a real S3 server and, while failFrom is
// above zero, drops the connection of every multipart upload part from
// that number on, as a server or network that dies half-way would.
type partProxy struct {
	*httptest.Server
	failFrom atomic.Int64
	parts    atomic.Int64 // parts that went through
}

func newPartProxy(t *testing.T, srv *testsvc.S3Server) *partProxy {
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	p := &partProxy{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int64
		if r.Method == http.MethodPut {
			fmt.Sscan(r.URL.Query().Get("partNumber"), &n)
		}
		if from := p.failFrom.Load(); n > 0 && from > 0 && n >= from {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		rp.ServeHTTP(w, r)
		if n > 0 {
			p.parts.Add(1)
		}
	}))
	t.Cleanup(p.Close)
	return p
}

// streamEnv is a pipeline whose shards go through partProxy to versitygw
// in 5 MiB parts, and a local parquet file whose shard takes several parts.
type streamEnv struct {
	p      *Pipeline
	direct store.Store // the same bucket, not through the proxy
	proxy  *partProxy
	tok    *tokenizer.Tokenizer
	job    ShardJob
	want   []string
}

func newStreamEnv(t *testing.T) *streamEnv {
	srv := testsvc.S3(t)
	e := &streamEnv{proxy: newPartProxy(t, srv), tok: testTokenizer(t)}
	viaProxy, err := store.NewS3(store.S3Options{Endpoint: strings.TrimPrefix(e.proxy.URL, "http://"), Bucket: "kiln",
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, PartSize: 5 << 20, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.direct = versityObjects(t, srv)
	dir := t.TempDir()
	e.p = &Pipeline{Objects: viaProxy, DataDir: filepath.Join(dir, "data"), StoresDir: filepath.Join(dir, "stores"), LocalRoots: []string{dir},
		Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return e.tok, nil }}
	// Hex text tokenizes to about a token per byte with this small
	// vocabulary: 3,000 documents of 2 KiB make over 10 MiB of uint16 ids.
	var rows []textRow
	for i := range 3000 {
		var b strings.Builder
		for j := 0; b.Len() < 2048; j++ {
			fmt.Fprintf(&b, "%x ", sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(j)}))
		}
		rows = append(rows, textRow{b.String()})
		e.want = append(e.want, b.String())
	}
	path := filepath.Join(dir, "a.parquet")
	writeParquet(t, path, rows, 500)
	e.job = ShardJob{Dataset: "local", Path: path, Store: "s", Tokenizer: "t", ShardID: "local:" + path, Columns: Columns{Text: "text"}}
	return e
}

// noShardObjects fails unless the store's shard prefix is empty.
func (e *streamEnv) noShardObjects(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	list, err := e.direct.List(ctx, ShardPrefix("s"))
	if err != nil || len(list) != 0 {
		t.Fatalf("%s: shard objects %+v, %v; want none", when, list, err)
	}
}

// A shard whose upload dies half-way leaves no object and no append job; a
// shard whose tokenization stops half-way does too; the retry that gets
// through appends every document once, with the hash it streamed.
func TestStreamedShardIsAppendedOnlyWhole(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newStreamEnv(t)

	e.proxy.failFrom.Store(2)
	out, done, err := e.p.Shard(ctx, e.job, nil)
	if err == nil || done || out.Object != "" || out.SkipReason != "" {
		t.Fatalf("shard through an upload that dies at part 2: %+v, done=%v, err=%v; want an error and no append job", out, done, err)
	}
	if !strings.Contains(err.Error(), "shard") || !strings.Contains(err.Error(), e.job.Path) {
		t.Errorf("error %q should name the shard's file", err)
	}
	if e.proxy.parts.Load() != 1 {
		t.Fatalf("%d parts went through before the failure; want 1 (the shard must span parts)", e.proxy.parts.Load())
	}
	e.noShardObjects(t, ctx, "after a failed upload")

	// Tokenization stopped (the task cancelled) after the first part is in.
	e.proxy.failFrom.Store(0)
	e.proxy.parts.Store(0)
	cctx, stop := context.WithCancel(ctx)
	go func() {
		for e.proxy.parts.Load() == 0 && cctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		stop()
	}()
	out, _, err = e.p.Shard(cctx, e.job, nil)
	stop()
	if !errors.Is(err, context.Canceled) || out.Object != "" {
		t.Fatalf("shard cancelled after part 1: %+v, %v; want context.Canceled and no append job", out, err)
	}
	e.noShardObjects(t, ctx, "after a cancelled shard")

	out, done, err = e.p.Shard(ctx, e.job, nil)
	if err != nil || done || out.Object == "" {
		t.Fatalf("shard: %+v, %v", out, err)
	}
	info, err := e.direct.Stat(ctx, out.Object)
	if err != nil || info.Size != 2*out.Tokens || out.Documents != int64(len(e.want)) {
		t.Fatalf("shard object %+v, %v; want %d bytes for %d tokens of %d documents", info, err, 2*out.Tokens, out.Tokens, len(e.want))
	}
	res, err := e.p.Append(ctx, out, nil)
	if err != nil || res.Tokens != out.Tokens {
		t.Fatalf("append: %+v, %v", res, err)
	}
	dir := filepath.Join(e.p.StoresDir, "s")
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeStore(t, e.tok, dir, m); got != strings.Join(e.want, "\x00EOS")+"\x00EOS" {
		t.Fatalf("the store's %d tokens are not the file's %d documents in order", m.Tokens, len(e.want))
	}
}

// The append still refuses a shard whose bytes are not those the shard
// step hashed, and the store stays as it was.
func TestAppendRefusesAShardThatDoesNotMatchItsHash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newStreamEnv(t)
	out, _, err := e.p.Shard(ctx, e.job, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.direct.Get(ctx, out.Object)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2&^1] ^= 1 // the low bit of an id: still one of the vocabulary's 300
	if err := e.direct.Put(ctx, out.Object, strings.NewReader(string(b)), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Append(ctx, out, nil)
	var bad interface{ BadInput() bool }
	if err == nil || !strings.Contains(err.Error(), "read 3 times") || !strings.Contains(err.Error(), "enqueue the ingest again") || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("append of a changed shard: %v; want a bad-input error saying the stored shard is not the one made, read 3 times", err)
	}
	// The shard is refused before the store is opened: no store was made,
	// or (a streamed shard) it is empty.
	m, err := tokens.ReadManifest(filepath.Join(e.p.StoresDir, "s"))
	if !errors.Is(err, fs.ErrNotExist) && (err != nil || m.Tokens != 0 || len(m.Shards) != 0) {
		t.Fatalf("store after a refused append: %+v, %v; want none or an empty one", m, err)
	}
	if st, err := e.p.Status(ctx, "s"); err != nil || len(st.Done) != 0 {
		t.Fatalf("status after a refused append: %+v, %v", st, err)
	}
}

// A file with no usable document is recorded as skipped and leaves no
// object: the upload starts only with the first token.
func TestEmptyShardLeavesNoObject(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newStreamEnv(t)
	path := filepath.Join(filepath.Dir(e.job.Path), "bad.parquet")
	writeParquet(t, path, []textRow{{"bad \xff utf8"}, {""}}, 2)
	job := e.job
	job.Path, job.ShardID = path, "local:"+path
	out, _, err := e.p.Shard(ctx, job, nil)
	if err != nil || out.SkipReason != SkipEmptyFile || out.Object != "" {
		t.Fatalf("shard of a file with no usable document: %+v, %v; want it skipped as %s", out, err, SkipEmptyFile)
	}
	e.noShardObjects(t, ctx, "after an empty file")
}
