package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// faultyS3 returns one real S3 server seen two ways: straight, and through
// a proxy whose faults the test adds.
func faultyS3(t *testing.T) (direct, faulty store.Store, f *testsvc.S3Faults) {
	t.Helper()
	srv := testsvc.S3(t)
	f = srv.Faults(t)
	for _, s := range []struct {
		endpoint string
		to       *store.Store
	}{{srv.Endpoint, &direct}, {f.Endpoint, &faulty}} {
		o, err := store.NewS3(store.S3Options{Endpoint: s.endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		*s.to = o
	}
	return direct, faulty, f
}

// corpus is the text the tests' tokenizer learns.
const corpus = "the cat sat on the mat, the cat sat on the hat; her other brother"

// parseableFlip is an offset of data, a tokenizer.json trained on corpus,
// where the one bit a Flip changes leaves a tokenizer that loads and
// encodes corpus with other ids: another vocabulary under the same name,
// which no parse error gives away.
func parseableFlip(t *testing.T, data []byte) int64 {
	t.Helper()
	tok, err := tokenizer.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode(corpus)
	for at := range data {
		b := bytes.Clone(data)
		b[at] ^= 0x01
		if other, err := tokenizer.Parse(b); err == nil && !slices.Equal(other.Encode(corpus), ids) {
			return int64(at)
		}
	}
	t.Fatal("no flip leaves a tokenizer that loads with another vocabulary")
	return 0
}

func wantNoCopy(t *testing.T, c *Catalog, name string) {
	t.Helper()
	left, err := os.ReadDir(filepath.Join(c.Dir, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Errorf("saved on this machine: %v; want nothing", left)
	}
}

func wantCopy(t *testing.T, c *Catalog, name string, data []byte) {
	t.Helper()
	b, err := os.ReadFile(c.localPath(name))
	if err != nil || !bytes.Equal(b, data) {
		t.Errorf("this machine's copy has sha256 %s (%v); want the published %s", sha(b), err, sha(data))
	}
}

// Publish puts the tokenizer's SHA-256 beside it, in sha256sum's format.
// A download changed on its way once (a bit that leaves the file loading,
// with another vocabulary) is read again, and what is saved and used is
// the published tokenizer.
func TestResolveReadsAChangedDownloadAgain(t *testing.T) {
	ctx := context.Background()
	direct, faulty, f := faultyS3(t)
	data := train(t, 300, corpus)
	if _, err := New(direct, t.TempDir()).Publish(ctx, "tok", data); err != nil {
		t.Fatal(err)
	}
	f.Add(testsvc.Fault{Method: "GET", Path: Key("tok"), Action: testsvc.Flip, At: parseableFlip(t, data), Count: 1})
	there := New(faulty, t.TempDir())
	e, tok, err := there.Resolve(ctx, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if e.SHA256 != sha(data) || tok.SHA256() != sha(data) {
		t.Errorf("resolved sha256 %s (loaded %s); want the published %s", e.SHA256, tok.SHA256(), sha(data))
	}
	wantCopy(t, there, "tok", data)
	if n := f.Acted(Key("tok")); n != 1 {
		t.Errorf("%d downloads changed; want 1", n)
	}
	var sums []byte
	r, err := direct.Get(ctx, SumsKey("tok"))
	if err == nil {
		sums, err = io.ReadAll(r)
		r.Close()
	}
	if want := sha(data) + "  tokenizer.json\n"; err != nil || string(sums) != want {
		t.Errorf("%s holds %q (%v); want %q", SumsKey("tok"), sums, err, want)
	}
}

// A download changed on its way every time, whether the change breaks the
// JSON (the file's middle) or leaves another vocabulary that loads, fails
// saying it did not match what was published, naming the published hash: no
// conflict, no bad input (a task meeting it is tried again), and nothing
// saved, so that once the downloads come whole the tokenizer resolves.
func TestResolveRefusesADownloadThatNeverMatches(t *testing.T) {
	ctx := context.Background()
	direct, faulty, f := faultyS3(t)
	data := train(t, 300, corpus)
	if _, err := New(direct, t.TempDir()).Publish(ctx, "tok", data); err != nil {
		t.Fatal(err)
	}
	there := New(faulty, t.TempDir())
	for _, at := range []int64{-1, parseableFlip(t, data)} {
		f.Clear()
		f.Add(testsvc.Fault{Method: "GET", Path: Key("tok"), Action: testsvc.Flip, At: at})
		_, _, err := there.Resolve(ctx, "tok")
		var dl *DownloadError
		var ce *ConflictError
		if !errors.As(err, &dl) || errors.As(err, &ce) || isBadInput(err) {
			t.Fatalf("flip at %d: got %v; want a DownloadError, neither a conflict nor bad input", at, err)
		}
		msg := err.Error()
		for _, want := range []string{"no download of tokenizers/tok/tokenizer.json matched what was published", sha(data), SumsKey("tok"), "none was saved"} {
			if !strings.Contains(msg, want) {
				t.Errorf("flip at %d: %q lacks %q", at, msg, want)
			}
		}
		if strings.Contains(msg, "replaced outside kiln") {
			t.Errorf("flip at %d: %q blames a replacement", at, msg)
		}
		wantNoCopy(t, there, "tok")
		list, err := there.List(ctx)
		if err != nil || len(list) != 1 || !strings.Contains(list[0].Unreadable, "published "+sha(data)[:12]) {
			t.Errorf("flip at %d: listed %+v (%v); want the tokenizer unreadable for its download", at, list, err)
		}
	}
	if n := f.Acted(Key("tok")); n < 2*downloadReads {
		t.Errorf("%d downloads changed; want each refusal to have read %d times", n, downloadReads)
	}
	f.Clear()
	e, _, err := there.Resolve(ctx, "tok")
	if err != nil || e.SHA256 != sha(data) {
		t.Fatalf("once downloads come whole: %+v, %v; want the published tokenizer", e, err)
	}
	wantCopy(t, there, "tok", data)
}

// A machine holding the published tokenizer is told of no conflict when
// a download of it comes changed: once, the read again matches; every
// time, its own copy has the published SHA-256 and serves.
func TestAMachineWithThePublishedCopyIsToldOfNoConflict(t *testing.T) {
	ctx := context.Background()
	_, faulty, f := faultyS3(t)
	data := train(t, 300, corpus)
	here := New(faulty, t.TempDir())
	if _, err := here.Publish(ctx, "tok", data); err != nil {
		t.Fatal(err)
	}
	for _, count := range []int{1, 0} {
		f.Clear()
		f.Add(testsvc.Fault{Method: "GET", Path: Key("tok"), Action: testsvc.Flip, At: parseableFlip(t, data), Count: count})
		e, tok, err := here.Resolve(ctx, "tok")
		if err != nil || e.SHA256 != sha(data) || tok.SHA256() != sha(data) {
			t.Errorf("flipped downloads (count %d): %+v, %v; want the published tokenizer, no conflict", count, e, err)
		}
		wantCopy(t, here, "tok", data)
		if f.Acted(Key("tok")) == 0 {
			t.Errorf("count %d: no download was changed", count)
		}
	}
}

// A tokenizer published before kiln wrote SHA256SUMS is checked against
// the sha256 of its report.json.
func TestResolveChecksAnEarlierTokenizerAgainstItsReport(t *testing.T) {
	ctx := context.Background()
	direct, faulty, f := faultyS3(t)
	data := train(t, 300, corpus)
	if err := direct.Put(ctx, Key("old"), bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	report, err := json.Marshal(Report{Name: "old", SHA256: sha(data), VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Put(ctx, ReportKey("old"), bytes.NewReader(report), int64(len(report))); err != nil {
		t.Fatal(err)
	}
	there := New(faulty, t.TempDir())
	f.Add(testsvc.Fault{Method: "GET", Path: Key("old"), Action: testsvc.Flip, At: parseableFlip(t, data)})
	_, _, err = there.Resolve(ctx, "old")
	var dl *DownloadError
	if !errors.As(err, &dl) || dl.Want != sha(data) || !strings.Contains(err.Error(), ReportKey("old")) {
		t.Fatalf("got %v; want a DownloadError against the report's sha256", err)
	}
	wantNoCopy(t, there, "old")
	f.Clear()
	f.Add(testsvc.Fault{Method: "GET", Path: Key("old"), Action: testsvc.Flip, At: parseableFlip(t, data), Count: 1})
	if _, _, err := there.Resolve(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	wantCopy(t, there, "old", data)
}

// A tokenizer put in object storage with no hash beside it (by hand, or by
// 'sched demo') is taken once two downloads agree; downloads that never
// agree are refused, nothing saved.
func TestResolveTakesAnUnhashedTokenizerOnceTwoReadsAgree(t *testing.T) {
	ctx := context.Background()
	direct, faulty, f := faultyS3(t)
	data := train(t, 300, corpus)
	if err := direct.Put(ctx, Key("bare"), bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	there := New(faulty, t.TempDir())
	// Each read changed at another byte: no two agree.
	for i := range downloadReads {
		f.Add(testsvc.Fault{Method: "GET", Path: Key("bare"), Action: testsvc.Flip, At: int64(100 + i), Count: 1})
	}
	_, _, err := there.Resolve(ctx, "bare")
	var dl *DownloadError
	if !errors.As(err, &dl) || dl.Want != "" || len(dl.Got) != downloadReads || isBadInput(err) ||
		!strings.Contains(err.Error(), "no two downloads of tokenizers/bare/tokenizer.json came the same") {
		t.Fatalf("got %v; want a DownloadError of %d reads that never agreed", err, downloadReads)
	}
	wantNoCopy(t, there, "bare")

	f.Add(testsvc.Fault{Method: "GET", Path: Key("bare"), Action: testsvc.Flip, At: parseableFlip(t, data), Count: 1})
	e, _, err := there.Resolve(ctx, "bare")
	if err != nil || e.SHA256 != sha(data) {
		t.Fatalf("a download changed once: %+v, %v; want the stored tokenizer", e, err)
	}
	wantCopy(t, there, "bare", data)
}
