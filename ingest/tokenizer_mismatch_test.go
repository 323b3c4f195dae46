package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// An ingest into a store that another tokenizer wrote is refused, as bad
// input naming the store and both tokenizers, before it lists the dataset
// (the plan) or downloads a file (a shard already queued): it would only
// be refused at its append, after the download and the tokenizing. The
// store is left as it was.
func TestAnotherTokenizersIngestStopsBeforeReadingAFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	toks := map[string]*tokenizer.Tokenizer{"first": testTokenizer(t)}
	p, h := newCorpus(t, toks)
	objects := p.Objects
	for f := range 2 {
		h.Add(corpusRepo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, []textRow{{Text: fmt.Sprintf("file %d: func main() {}", f)}}), true)
	}
	other, err := tokenizer.Train(ctx, []io.Reader{strings.NewReader(strings.Repeat("SELECT name FROM users WHERE id = 1;\n", 200))}, tokenizer.TrainOptions{VocabSize: 280})
	if err != nil {
		t.Fatal(err)
	}
	if toks["second"], err = tokenizer.Parse(other); err != nil {
		t.Fatal(err)
	}
	const name = "code"
	res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "first", Seed: 3})
	if err != nil || len(res.Shards) != 2 {
		t.Fatalf("plan: %+v, %v", res, err)
	}
	in, done, err := p.Shard(ctx, res.Shards[0], nil)
	if err != nil || done {
		t.Fatalf("shard: %+v, %v, %v", in, done, err)
	}
	if _, err := p.Append(ctx, in, nil); err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(p.StoresDir, name)
	before, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
	if err != nil {
		t.Fatal(err)
	}

	refused := func(what string, err error) {
		t.Helper()
		var bad interface{ BadInput() bool }
		if err == nil || !errors.As(err, &bad) || !bad.BadInput() || !strings.Contains(err.Error(), "token store "+name) ||
			!strings.Contains(err.Error(), "tokenizer first") || !strings.Contains(err.Error(), "not second") {
			t.Errorf("%s with tokenizer second into store %s of tokenizer first: %v; want bad input naming the store and both", what, name, err)
		}
	}
	requests := len(h.Requests())
	res2, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "second", Seed: 3})
	refused("plan", err)
	if len(res2.Shards) != 0 {
		t.Errorf("the refused plan queued %d shards", len(res2.Shards))
	}
	queued := res.Shards[1]
	queued.Tokenizer = "second"
	_, _, err = p.Shard(ctx, queued, nil)
	refused("shard", err)
	if got := h.Requests()[requests:]; len(got) != 0 {
		t.Errorf("the refused ingest asked the hub %d times: %+v", len(got), got)
	}
	if _, err := objects.Stat(ctx, ShardObject(name, queued.ShardID)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused shard left an object: %v", err)
	}
	after, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("the store's tokens changed (%v)", err)
	}
	// The same store's own tokenizer goes on.
	if _, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "first", Seed: 3}); err != nil {
		t.Errorf("plan with the store's own tokenizer: %v", err)
	}
}

// A store that a direct ingest made in the append worker's store
// directory has no status in object storage, so an ingest queued with
// another tokenizer is planned; its first append is refused, and from then
// on the status names the store's tokenizer: the shards queued behind it
// stop before they download their file, and a plan is refused.
func TestAnotherTokenizersIngestOfADirectStoreStopsAtItsFirstAppend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	toks := map[string]*tokenizer.Tokenizer{"first": testTokenizer(t)}
	p, h := newCorpus(t, toks)
	for f := range 3 {
		h.Add(corpusRepo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, []textRow{{Text: fmt.Sprintf("file %d: func main() {}", f)}}), true)
	}
	other, err := tokenizer.Train(ctx, []io.Reader{strings.NewReader(strings.Repeat("SELECT name FROM users WHERE id = 1;\n", 200))}, tokenizer.TrainOptions{VocabSize: 280})
	if err != nil {
		t.Fatal(err)
	}
	if toks["second"], err = tokenizer.Parse(other); err != nil {
		t.Fatal(err)
	}
	const name = "code"
	storeDir := filepath.Join(p.StoresDir, name)
	rep, err := Direct(ctx, DirectOptions{Preset: p.Presets["corpus"], Hub: p.Hub, Tokenizer: toks["first"], TokenizerName: "first",
		StoreDir: storeDir, DataDir: t.TempDir(), Seed: 3})
	if err != nil || rep.Appended != 3 {
		t.Fatalf("direct ingest: %+v, %v", rep, err)
	}
	before, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
	if err != nil {
		t.Fatal(err)
	}

	res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "second", Seed: 3})
	if err != nil || len(res.Shards) != 3 {
		t.Fatalf("plan of a store without a status: %+v, %v", res, err)
	}
	in, _, err := p.Shard(ctx, res.Shards[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	var bad interface{ BadInput() bool }
	if _, err := p.Append(ctx, in, nil); !errors.As(err, &bad) || !strings.Contains(err.Error(), "tokenizer first") {
		t.Fatalf("append with tokenizer second into the store of tokenizer first: %v", err)
	}
	requests := len(h.Requests())
	for _, j := range res.Shards[1:] {
		if _, _, err := p.Shard(ctx, j, nil); !errors.As(err, &bad) || !strings.Contains(err.Error(), "tokenizer first") {
			t.Errorf("shard of %s queued behind the refused append: %v; want it refused naming the store's tokenizer", j.Path, err)
		}
	}
	if got := h.Requests()[requests:]; len(got) != 0 {
		t.Errorf("the shards queued behind the refused append asked the hub %d times: %+v", len(got), got)
	}
	if _, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "second", Seed: 3}); !errors.As(err, &bad) {
		t.Errorf("plan with tokenizer second after the refused append: %v", err)
	}
	if res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: name, Tokenizer: "first", Seed: 3}); err != nil || len(res.Shards) != 0 || res.Done != 3 {
		t.Errorf("plan with the store's own tokenizer: %+v, %v; want its three files done", res, err)
	}
	after, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
	if err != nil || !bytes.Equal(before, after) {
		t.Errorf("the store's tokens changed (%v)", err)
	}
}
