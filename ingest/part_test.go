package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
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

	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// A layout maps a shard's documents to their file's records around the
// records left out.
func TestLayoutPlacesDocumentsInTheirFile(t *testing.T) {
	// Records 10 to 29; 12-13, 14 and 20 left out, and the last two.
	l := Layout{From: 10, Skips: []SkipRun{{At: 12, N: 2, Reason: "a"}, {At: 14, N: 1, Reason: "b"}, {At: 20, N: 1, Reason: "a"}, {At: 28, N: 2, Reason: "b"}}}
	var records []int64
	for r := int64(10); r < 30; r++ {
		if !slices.ContainsFunc(l.Skips, func(s SkipRun) bool { return r >= s.At && r < s.At+s.N }) {
			records = append(records, r)
		}
	}
	if err := l.check(int64(len(records))); err != nil {
		t.Fatal(err)
	}
	for doc, rec := range records {
		if got := l.recordOf(int64(doc)); got != rec {
			t.Errorf("document %d: record %d, want %d", doc, got, rec)
		}
		if got := l.docsBefore(rec); got != int64(doc) {
			t.Errorf("documents before record %d: %d, want %d", rec, got, doc)
		}
	}
	if got := l.docsBefore(5); got != 0 {
		t.Errorf("documents before the shard's first record: %d", got)
	}
	if got := l.docsBefore(30); got != int64(len(records)) {
		t.Errorf("documents before the end: %d, want %d", got, len(records))
	}
	for _, c := range []struct {
		from, to int64
		want     string
	}{{10, 0, "a=3, b=3"}, {10, 14, "a=2"}, {13, 21, "a=2, b=1"}, {21, 0, "b=2"}, {15, 20, ""}} {
		if got := l.skipsIn(c.from, c.to).String(); got != c.want {
			t.Errorf("left out from %d to %d: %q, want %q", c.from, c.to, got, c.want)
		}
	}
	for _, bad := range []Layout{
		{Skips: []SkipRun{{At: 5, N: 1, Reason: "a"}, {At: 5, N: 1, Reason: "a"}}},
		{From: 3, Skips: []SkipRun{{At: 1, N: 1, Reason: "a"}}},
		{EOSInside: []EOSInside{{Doc: 4, N: 1}}},
		{EOSInside: []EOSInside{{Doc: 1, N: 1}, {Doc: 1, N: 2}}},
	} {
		if err := bad.check(4); err == nil {
			t.Errorf("layout %+v passed its check", bad)
		}
	}
}

// A shard's layout says where its file's records were left out and which
// documents hold the EOS id in their own text; an append's cut falls at
// the end of a document, never at an EOS inside one; and the file read
// again from a record gives the documents of the records from there.
func TestAShardIsCutAtItsDocumentsEnds(t *testing.T) {
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	var lines []string
	var docs []string // the documents, in order
	var records []int64
	for i := range 40 {
		text := fmt.Sprintf("doc %d: %s", i, strings.Repeat("the quick brown fox ", 1+i%5))
		switch {
		case i%9 == 4:
			lines = append(lines, `{"text":""}`)
			continue
		case i%11 == 6:
			lines = append(lines, `{"other":1}`)
			continue
		case i%7 == 3:
			text = fmt.Sprintf("doc %d quotes <|endoftext|> twice <|endoftext|> in its text", i)
		}
		lines = append(lines, fmt.Sprintf(`{"text":%q}`, text))
		docs = append(docs, text)
		records = append(records, int64(i))
	}
	path := filepath.Join(t.TempDir(), "f.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ids := tok.Encode("a <|endoftext|> b"); !slices.Contains(ids, eos) {
		t.Fatal("the test tokenizer does not encode the end-of-text token in text: the test would not test it")
	}
	ctx := context.Background()
	shardOf := func(from int64) ([]byte, ShardStats) {
		t.Helper()
		src, err := Open(ctx, path, OpenOptions{From: from})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		var buf bytes.Buffer
		st, err := WriteShard(ctx, src, tok, &buf)
		if err != nil || st.Layout == nil {
			t.Fatalf("shard from record %d: %+v, %v", from, st, err)
		}
		st.Layout.From = from
		return buf.Bytes(), st
	}
	data, st := shardOf(0)
	l := st.Layout
	if st.Documents != int64(len(docs)) || len(l.EOSInside) == 0 || len(l.Skips) == 0 {
		t.Fatalf("shard: %d documents (want %d), layout %+v", st.Documents, len(docs), l)
	}
	for j, rec := range records {
		if got := l.recordOf(int64(j)); got != rec {
			t.Fatalf("document %d from record %d, the layout says %d", j, rec, got)
		}
	}
	// Each document's end, in tokens, encoded alone.
	var ends []int64
	var end int64
	for _, d := range docs {
		end += int64(len(tok.Encode(d))) + 1
		ends = append(ends, end)
	}
	endOf := func(doc int64) int64 {
		if doc < 0 {
			return 0
		}
		return ends[doc]
	}
	for lead := int64(0); lead <= int64(len(docs)); lead += 3 {
		for _, room := range []int64{0, 1, 9, 10, 25, 60, 200, 1 << 40} {
			c, err := findCut(bytes.NewReader(data), tokens.Uint16, eos, l, st.Documents, lead, room, shardSum{want: st.SHA256})
			if err != nil {
				t.Fatal(err)
			}
			n := int64(0)
			for lead+n < int64(len(docs)) && endOf(lead+n)-endOf(lead-1) <= room {
				n++
			}
			want := shardCut{Lead: lead, Docs: n, Start: endOf(lead - 1), End: endOf(lead + n - 1)}
			if lead+n < int64(len(docs)) {
				want.Next = endOf(lead+n) - endOf(lead+n-1)
			}
			if c != want {
				t.Fatalf("cut after %d documents in %d tokens: %+v, want %+v", lead, room, c, want)
			}
		}
	}
	if _, err := findCut(bytes.NewReader(data), tokens.Uint16, eos, l, st.Documents+1, 0, 10, shardSum{want: st.SHA256}); err == nil {
		t.Fatal("a cut of a shard whose documents its layout miscounts")
	}
	if _, err := findCut(bytes.NewReader(data[:len(data)-2]), tokens.Uint16, eos, l, st.Documents, 0, 10, shardSum{want: st.SHA256}); err == nil {
		t.Fatal("a cut of a shard that is not the one recorded")
	}
	// A shard made for a store with room for few tokens ends with the
	// document that passes them, at the record after it, and counts the
	// records left out before it alone.
	for _, room := range []int64{0, 30, 200, endOf(int64(len(docs))-2) - 1} {
		src, err := Open(ctx, path, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		short, err := writeShard(ctx, src, tok, &buf, 0, room)
		src.Close()
		k := int64(1)
		for endOf(k-1) <= room {
			k++
		}
		if err != nil || short.Documents != k || short.Layout == nil || short.Layout.To != records[k-1]+1 || !bytes.Equal(buf.Bytes(), data[:endOf(k-1)*2]) {
			t.Fatalf("shard for room %d: %+v, %v; want its first %d documents, to record %d", room, short, err, k, records[k-1]+1)
		}
		if got, want := short.Skips.String(), l.skipsIn(0, short.Layout.To).String(); got != want || short.Layout.check(k) != nil {
			t.Fatalf("shard for room %d left out %s, want %s (%v)", room, got, want, short.Layout.check(k))
		}
	}
	// The file's rest, read from the record after a cut, is the shard's
	// documents after it.
	for _, k := range []int64{1, 5, 13, int64(len(docs)) - 1} {
		from := l.recordOf(k)
		rest, rst := shardOf(from)
		if rst.Documents != int64(len(docs))-k || !bytes.Equal(rest, data[endOf(k-1)*2:]) {
			t.Fatalf("the file from record %d: %d documents, want the shard's last %d", from, rst.Documents, int64(len(docs))-k)
		}
		if got, want := rst.Skips.String(), l.skipsIn(from, 0).String(); got != want {
			t.Fatalf("the file from record %d left out %s, want %s", from, got, want)
		}
	}
}

// partFile is a file of the partial-ingest fixture: one document a row,
// some rows left out (empty, not UTF-8), one quoting the end-of-text token.
func partFile(f, rows int) ([]textRow, []string) {
	var out []textRow
	var docs []string
	for d := range rows {
		text := fmt.Sprintf("file %d doc %d: %s", f, d, strings.Repeat("the quick brown fox ", 1+(d*7+f)%6))
		switch d % 8 {
		case 3:
			text = ""
		case 5:
			text = fmt.Sprintf("file %d doc %d: bad \xff bytes", f, d)
		case 6:
			text = fmt.Sprintf("file %d doc %d: quotes <|endoftext|> in its text", f, d)
		}
		out = append(out, textRow{Text: text})
		if d%8 != 3 && d%8 != 5 {
			docs = append(docs, text)
		}
	}
	return out, docs
}

// storeDocs are the documents the store in dir holds, in order, each of
// them one of all: it fails unless the store's ids are whole documents of
// all and nothing else.
func storeDocs(t *testing.T, tok *tokenizer.Tokenizer, dir string, all []string) []string {
	t.Helper()
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	rendered := map[string]string{}
	for _, d := range all {
		var b strings.Builder
		var unit []uint32
		for _, id := range append(tok.Encode(d), eos) {
			if id == eos {
				s, err := tok.Decode(unit)
				if err != nil {
					t.Fatal(err)
				}
				b.WriteString(s + "\x00EOS")
				unit = unit[:0]
				continue
			}
			unit = append(unit, id)
		}
		rendered[b.String()] = d
	}
	s := decodeStore(t, tok, dir, m)
	var out []string
	for s != "" {
		found := false
		for r, d := range rendered {
			if strings.HasPrefix(s, r) {
				out = append(out, d)
				s = s[len(r):]
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("the store holds what is no whole document of the dataset: %q", s[:min(len(s), 80)])
		}
	}
	return out
}

// sameDocs fails unless got holds each document of want once.
func sameDocs(t *testing.T, got, want []string) {
	t.Helper()
	g, w := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if !slices.Equal(g, w) {
		t.Fatalf("the store holds %d documents, want the dataset's %d once each (%d distinct held)", len(g), len(w), len(slices.Compact(slices.Clone(g))))
	}
}

// leftOut sums a manifest's counts of documents left out, by reason.
func leftOut(m *tokens.Manifest) string {
	s := Skips{}
	for _, k := range m.Skipped {
		if k.Count > 0 {
			s.Add(k.Reason, k.Count)
		}
	}
	return s.String()
}

// partHub is a hub dataset of files each of more tokens than the limits
// that partial-ingest tests start with, and the documents they hold.
func partHub(t *testing.T, h *hubtest.Hub, repo string) []string {
	var all []string
	for f := range 3 {
		rows, docs := partFile(f, 14+f)
		h.Add(repo, fmt.Sprintf("data/part-%d.parquet", f), parquetBytes(t, rows), true) // 3 rows a row group
		all = append(all, docs...)
	}
	return all
}

// A direct ingest under a limit smaller than one file fills the store up
// to the limit with the leading whole documents of the first file; under
// larger limits it takes the rest of that file, then the other files,
// each in part where the limit falls in it; and at the end the store holds
// the documents a one-shot ingest with no limit takes, each once, with
// the same counts of what it left out.
func TestDirectFillsTheStoreToItsLimit(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	all := partHub(t, h, "owner/parts")
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	dir := t.TempDir()
	opt := DirectOptions{Preset: Preset{Name: "parts", Repo: "owner/parts", Revision: "main", Include: []string{"data/*"}, Columns: Columns{Text: "text"}},
		Hub: hc, Tokenizer: tok, TokenizerName: "t", StoreDir: filepath.Join(dir, "whole"), DataDir: filepath.Join(dir, "data"), Seed: 5}
	ctx := context.Background()
	if rep, err := Direct(ctx, opt); err != nil || rep.Appended != 3 {
		t.Fatalf("one-shot ingest: %+v, %v", rep, err)
	}
	ref, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	refDocs := storeDocs(t, tok, opt.StoreDir, all)
	sameDocs(t, refDocs, all)
	first, second := ref.Shards[0], ref.Shards[1]

	opt.StoreDir = filepath.Join(dir, "limited")
	var held []string
	check := func(limit int64) (*tokens.Manifest, []string) {
		t.Helper()
		m, err := tokens.ReadManifest(opt.StoreDir)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && m.Tokens > limit {
			t.Fatalf("the store holds %d tokens, past --max-tokens %d", m.Tokens, limit)
		}
		docs := storeDocs(t, tok, opt.StoreDir, all)
		if len(docs) < len(held) || !slices.Equal(docs[:len(held)], held) {
			t.Fatal("the documents in before a run changed")
		}
		if len(slices.Compact(slices.Sorted(slices.Values(docs)))) != len(docs) {
			t.Fatal("the store holds a document twice")
		}
		held = docs
		return m, docs
	}

	// Less than one file: its leading documents.
	opt.MaxTokens = first.Tokens * 2 / 5
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Partial != 1 || rep.Appended != 0 || rep.Tokens <= 0 || rep.Tokens > opt.MaxTokens ||
		!strings.Contains(rep.Stopped, fmt.Sprintf("reached --max-tokens %d with part of %s taken", opt.MaxTokens, first.Source)) {
		t.Fatalf("ingest under less than a file: %+v, %v", rep, err)
	}
	m, docs := check(opt.MaxTokens)
	if m.Tokens != rep.Tokens || len(docs) == 0 || len(m.Shards) != 1 || m.Shards[0].Part.From != 0 || m.Shards[0].Part.To == 0 {
		t.Fatalf("the store after the first run: %d tokens, %d documents, shards %+v", m.Tokens, len(docs), m.Shards)
	}
	// It says how much of the file went in, not how many documents the
	// shard read past the limit (one) as if they were the file's rest.
	if want := fmt.Sprintf("its first %d documents are in the store (%d tokens), the rest of the file is not", len(docs), m.Tokens); !strings.Contains(rep.Stopped, want) {
		t.Fatalf("the ingest stopped saying %q; want it to say %q", rep.Stopped, want)
	}
	for _, d := range docs {
		if !strings.HasPrefix(d, strings.Fields(docs[0])[0]+" "+strings.Fields(docs[0])[1]+" ") {
			t.Fatalf("the first run took documents of two files: %q, %q", docs[0], d)
		}
	}
	// The same limit again stops before reading a file.
	if rep, err := Direct(ctx, opt); err != nil || rep.Files != 0 || !strings.Contains(rep.Stopped, "full at --max-tokens") {
		t.Fatalf("the same limit again: %+v, %v", rep, err)
	}
	// A larger limit that the next document still passes: nothing is
	// taken.
	next := int64(len(tok.Encode(refDocs[len(docs)]))) + 1
	if m.Tokens+next-1 > opt.MaxTokens {
		opt.MaxTokens = m.Tokens + next - 1
		rep, err = Direct(ctx, opt)
		if err != nil || rep.Tokens != 0 || rep.Partial != 0 || !strings.Contains(rep.Stopped, "stopped before the rest of "+first.Source) {
			t.Fatalf("a limit the next document passes: %+v, %v", rep, err)
		}
		check(opt.MaxTokens)
	} else {
		t.Logf("the next document (%d tokens) passes no larger limit than %d", next, opt.MaxTokens)
	}
	// The rest of the first file, and part of the second.
	opt.MaxTokens = first.Tokens + second.Tokens/2
	rep, err = Direct(ctx, opt)
	if err != nil || rep.Appended != 1 || rep.Partial != 1 || !strings.Contains(rep.Stopped, "with part of "+second.Source) {
		t.Fatalf("the rest of the first file and part of the second: %+v, %v", rep, err)
	}
	if m, _ = check(opt.MaxTokens); m.Input(first.ID).Tokens != first.Tokens || !m.Input(first.ID).Whole || !m.Input(second.ID).Partial() {
		t.Fatalf("after the second run: %+v", m.Shards)
	}
	// No limit: everything else.
	opt.MaxTokens = 0
	if rep, err = Direct(ctx, opt); err != nil || rep.Appended != 2 || rep.Stopped != "" {
		t.Fatalf("no limit: %+v, %v", rep, err)
	}
	m, docs = check(0)
	sameDocs(t, docs, all)
	if m.Tokens != ref.Tokens || m.Documents != ref.Documents || leftOut(m) != leftOut(ref) {
		t.Fatalf("the store in parts: %d tokens, %d documents, left out %s; one-shot: %d, %d, %s",
			m.Tokens, m.Documents, leftOut(m), ref.Tokens, ref.Documents, leftOut(ref))
	}
	if rep, err = Direct(ctx, opt); err != nil || rep.Appended != 0 || rep.Duplicates != 3 {
		t.Fatalf("a run again: %+v, %v", rep, err)
	}
}

// Through the queue, with every shard of a plan tokenized before the first
// append (as workers do), each append decides under the store's lock how
// much of its shard fits: the store ends at most at its limit with whole
// documents only; a retry of an append that took part of its shard takes
// nothing more; and larger limits then take the rest of each file in part
// and the files left out, until the store holds what a one-shot ingest
// takes, each document once. Shards read whole before their append and
// shards streamed into the store are cut alike.
func TestTheQueueFillsTheStoreToItsLimit(t *testing.T) {
	for _, c := range []struct {
		name     string
		prefetch int64
	}{{"prefetched", 0}, {"streamed", -1}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tok := testTokenizer(t)
			p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": tok})
			p.Prefetch = c.prefetch
			all := partHub(t, h, corpusRepo)
			ctx := context.Background()
			type staleShard struct {
				job  AppendJob
				data []byte
			}
			var stale *staleShard
			round := func(storeName string, l Limits) (stops []string, parts int) {
				t.Helper()
				res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: storeName, Tokenizer: "t", Seed: 5, Limits: l})
				var stop *StopError
				if errors.As(err, &stop) {
					return []string{stop.Msg}, 0
				}
				if err != nil {
					t.Fatal(err)
				}
				var jobs []AppendJob
				for _, sj := range res.Shards {
					out, done, err := p.Shard(ctx, sj, nil)
					switch {
					case errors.As(err, &stop):
						stops = append(stops, stop.Msg)
					case err != nil:
						t.Fatal(err)
					case !done:
						jobs = append(jobs, out)
					}
				}
				for _, j := range jobs {
					var shard []byte
					if r, err := p.Objects.Get(ctx, j.Object); err == nil {
						var buf bytes.Buffer
						buf.ReadFrom(r)
						r.Close()
						shard = buf.Bytes()
					}
					res, err := p.Append(ctx, j, nil)
					switch {
					case errors.As(err, &stop):
						stops = append(stops, stop.Msg)
						if res.Part {
							parts++
							// A retry finds its part in and takes no more,
							// with its shard gone or still there.
							before, _ := tokens.ReadManifest(filepath.Join(p.StoresDir, storeName))
							for range 2 {
								if _, err := p.Append(ctx, j, nil); !errors.As(err, &stop) {
									t.Fatalf("a retry of an append that took a part: %v", err)
								}
								if after, _ := tokens.ReadManifest(filepath.Join(p.StoresDir, storeName)); after.Tokens != before.Tokens {
									t.Fatalf("a retry of an append that took a part took %d tokens more", after.Tokens-before.Tokens)
								}
								if err := p.Objects.Put(ctx, j.Object, bytes.NewReader(shard), int64(len(shard))); err != nil {
									t.Fatal(err)
								}
							}
							if stale == nil {
								stale = &staleShard{job: j, data: shard}
							}
							p.Objects.Delete(ctx, j.Object)
						}
					case err != nil:
						t.Fatal(err)
					}
				}
				return stops, parts
			}
			if stops, _ := round("whole", Limits{}); len(stops) != 0 {
				t.Fatalf("one-shot ingest stopped: %v", stops)
			}
			refDir := filepath.Join(p.StoresDir, "whole")
			ref, err := tokens.ReadManifest(refDir)
			if err != nil {
				t.Fatal(err)
			}
			sameDocs(t, storeDocs(t, tok, refDir, all), all)

			dir := filepath.Join(p.StoresDir, "limited")
			var held []string
			smallest := slices.MinFunc(ref.Shards, func(a, b tokens.Shard) int { return int(a.Tokens - b.Tokens) }).Tokens
			for i, limit := range []int64{smallest / 3, smallest, ref.Tokens / 2, ref.Tokens - 5, 0} {
				if i == 1 {
					// A shard of a whole file the store holds part of (a
					// plan made before the part, under a larger limit):
					// its append takes the documents after the part.
					before, _ := tokens.ReadManifest(dir)
					in := before.Input(stale.job.ShardID)
					if err := p.Objects.Put(ctx, stale.job.Object, bytes.NewReader(stale.data), int64(len(stale.data))); err != nil {
						t.Fatal(err)
					}
					stale.job.Limits = Limits{MaxTokens: before.Tokens + (smallest-before.Tokens)/2}
					res, err := p.Append(ctx, stale.job, nil)
					after, _ := tokens.ReadManifest(dir)
					if err != nil && !errors.As(err, new(*StopError)) || res.Tokens <= 0 || after.Input(stale.job.ShardID).Next <= in.Next && !after.Input(stale.job.ShardID).Whole {
						t.Fatalf("a whole file's shard after a part of it: %+v, %v", res, err)
					}
				}
				stops, parts := round("limited", Limits{MaxTokens: limit})
				m, err := tokens.ReadManifest(dir)
				if err != nil {
					t.Fatal(err)
				}
				docs := storeDocs(t, tok, dir, all)
				if len(docs) < len(held) || !slices.Equal(docs[:len(held)], held) || len(slices.Compact(slices.Sorted(slices.Values(docs)))) != len(docs) {
					t.Fatalf("limit %d: the documents in before changed, or one is in twice", limit)
				}
				held = docs
				if limit == 0 {
					if len(stops) != 0 {
						t.Fatalf("no limit: stopped: %v", stops)
					}
					break
				}
				if m.Tokens > limit || len(stops) == 0 || i < 3 && (m.Tokens == 0 || parts == 0) {
					t.Fatalf("limit %d: %d tokens, %d taken in part, stops %q", limit, m.Tokens, parts, stops)
				}
				st, err := p.Status(ctx, "limited")
				if err != nil || st.Tokens != m.Tokens || st.Full.MaxTokens != limit || i < 3 && len(st.Partial) == 0 {
					t.Fatalf("limit %d: status %+v, %v", limit, st, err)
				}
			}
			m, err := tokens.ReadManifest(dir)
			if err != nil {
				t.Fatal(err)
			}
			sameDocs(t, held, all)
			if m.Tokens != ref.Tokens || m.Documents != ref.Documents || leftOut(m) != leftOut(ref) {
				t.Fatalf("the store in parts: %d tokens, %d documents, left out %s; one-shot: %d, %d, %s",
					m.Tokens, m.Documents, leftOut(m), ref.Tokens, ref.Documents, leftOut(ref))
			}
			if st, err := p.Status(ctx, "limited"); err != nil || len(st.Partial) != 0 || len(st.Done) != 3 || st.Full != (Limits{}) {
				t.Fatalf("status at the end: %+v, %v", st, err)
			}
			if objs, err := p.Objects.List(ctx, ShardPrefix("limited")); err != nil || len(objs) != 0 {
				t.Fatalf("shards left in object storage: %v, %v", objs, err)
			}
		})
	}
}

// The documents of a file of Software Heritage ids are not the same each
// time it is read when a blob is missing one time and there the next. The
// rest of a file taken in part is read from the record after the part, so
// its blobs before are not fetched again, a blob that was missing in the
// part stays out (recorded as left out), and one missing when the part was
// taken but there for the rest goes in: no document twice, none lost.
func TestTheRestOfASoftwareHeritageFileStartsAtItsRecord(t *testing.T) {
	dir := t.TempDir()
	fake := hubtest.NewSWH()
	defer fake.Close()
	h := hubtest.New()
	defer h.Close()
	var rows []blobRow
	text := func(i int) string { return fmt.Sprintf("def f%d():\n    return %d # the quick brown fox\n", i, i) }
	late := map[int]bool{2: true, 15: true} // missing at the first read
	var all []string
	for i := range 20 {
		if !late[i] {
			fake.Add(blobID(i), []byte(text(i)))
		}
		rows = append(rows, blobRow{BlobID: blobID(i), SrcEncoding: "UTF-8"})
		all = append(all, text(i))
	}
	p := filepath.Join(dir, "ids.parquet")
	writeParquet(t, p, rows, 5)
	b, _ := os.ReadFile(p)
	h.Add("owner/ids", "data/ids.parquet", b, true)

	var mu sync.Mutex
	fetched := map[string]int{}
	backend, _ := url.Parse(fake.URL())
	proxy := httputil.NewSingleHostReverseProxy(backend)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fetched[strings.TrimPrefix(r.URL.Path, "/content/")]++
		mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	defer counting.Close()
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	opt := DirectOptions{Preset: Preset{Name: "ids", Repo: "owner/ids", Revision: "main", Include: []string{"data/*.parquet"},
		Columns: Columns{Blob: "blob_id", Encoding: "src_encoding"}}, Hub: hc, Tokenizer: tok, TokenizerName: "test",
		StoreDir: filepath.Join(dir, "store"), DataDir: filepath.Join(dir, "data"), SWH: &SWH{Endpoint: counting.URL, InFlight: 4}}
	perDoc := int64(len(tok.Encode(text(10)))) + 1
	opt.MaxTokens = 8 * perDoc
	ctx := context.Background()
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Partial != 1 || rep.Tokens > opt.MaxTokens {
		t.Fatalf("first run: %+v, %v", rep, err)
	}
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || len(m.Shards) != 1 {
		t.Fatalf("first run: %+v, %v", m, err)
	}
	to := m.Shards[0].Part.To
	if to <= 3 || to >= 15 || leftOut(m) != SkipMissingBlob+"=1" {
		t.Fatalf("the first part holds records up to %d, left out %s; want past blob 2 and before blob 15, with blob 2 left out", to, leftOut(m))
	}
	for _, i := range slices.Sorted(maps.Keys(late)) {
		fake.Add(blobID(i), []byte(text(i)))
	}
	mu.Lock()
	clear(fetched)
	mu.Unlock()
	opt.MaxTokens = 0
	if rep, err = Direct(ctx, opt); err != nil || rep.Appended != 1 || rep.Stopped != "" {
		t.Fatalf("the rest: %+v, %v", rep, err)
	}
	for i := range int(to) {
		if n := fetched[blobID(i)]; n != 0 {
			t.Fatalf("blob %d, of the part in the store, was fetched %d times for the rest", i, n)
		}
	}
	m, err = tokens.ReadManifest(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == text(2) })
	sameDocs(t, storeDocs(t, tok, opt.StoreDir, all), want)
	if leftOut(m) != SkipMissingBlob+"=1" || m.Documents != 19 {
		t.Fatalf("the store: %d documents, left out %s; want blob 2 alone left out", m.Documents, leftOut(m))
	}
}

// The rest of a file has an object of its own: a shard of the whole file
// and one of its rest never share a key.
func TestTheRestOfAFileHasAShardObjectOfItsOwn(t *testing.T) {
	id := "owner/x/data/a.parquet"
	whole, rest, other := restObject("s", id, 0), restObject("s", id, 40), restObject("s", id, 41)
	if whole != ShardObject("s", id) || whole == rest || rest == other || !strings.HasSuffix(rest, "-a.parquet.from-40.tokens") {
		t.Fatalf("keys %q, %q, %q", whole, rest, other)
	}
}

// The rest of a file taken in part that cannot be read (here a JSON lines
// file cut short, whose damage lies past the part) is recorded as left out
// after the part: the file is then whole in the store, and planned no more.
func TestARestThatCannotBeReadIsRecordedAsLeftOut(t *testing.T) {
	dir := t.TempDir()
	var z bytes.Buffer
	zw, err := zstd.NewWriter(&z)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20000 {
		fmt.Fprintf(zw, `{"text":"line %d of a file that is cut short: the quick brown fox"}`+"\n", i)
	}
	zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "cut.jsonl.zst"), z.Bytes()[:z.Len()/2], 0o644); err != nil {
		t.Fatal(err)
	}
	preset, err := LookupPreset(nil, "local:"+filepath.Join(dir, "*.jsonl.zst"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opt := DirectOptions{Preset: preset, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: filepath.Join(dir, "store"), DataDir: filepath.Join(dir, "data"), MaxTokens: 300}
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Partial != 1 || rep.Tokens <= 0 || rep.Tokens > opt.MaxTokens {
		t.Fatalf("the file's leading documents: %+v, %v", rep, err)
	}
	opt.MaxTokens = 0
	rep, err = Direct(ctx, opt)
	if err != nil || rep.SkippedFiles[SkipCorruptFile] != 1 || rep.Tokens != 0 {
		t.Fatalf("the rest: %+v, %v; want it recorded as a corrupt file's", rep, err)
	}
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || len(m.Shards) != 2 || len(m.Skipped) != 1 {
		t.Fatalf("manifest: %+v, %v", m, err)
	}
	rest, skip := m.Shards[1], m.Skipped[0]
	if rest.Tokens != 0 || rest.Part.From != m.Shards[0].Part.To || rest.Part.To != 0 ||
		skip.From != rest.Part.From || skip.Count != 0 || !strings.HasPrefix(skip.Reason, SkipCorruptFile+": ") {
		t.Fatalf("the rest in the manifest: %+v, left out %+v", rest, skip)
	}
	if rep, err = Direct(ctx, opt); err != nil || rep.Duplicates != 1 || rep.Appended != 0 || len(rep.SkippedFiles) != 0 {
		t.Fatalf("a run again: %+v, %v", rep, err)
	}
}

// Two ingests of one dataset into one store with other limits, queued
// together (the second while the first runs), each append their own shard
// of a file: the first's appends, which stop at its limit and delete their
// shards, leave the second's, and the second fills the store as if run
// alone, where its appends found their shards gone and failed for good.
func TestIngestsOfOtherLimitsQueuedTogetherKeepEachOthersShards(t *testing.T) {
	t.Parallel()
	tok := testTokenizer(t)
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": tok})
	all := partHub(t, h, corpusRepo)
	ctx := context.Background()
	shards := func(l Limits) []AppendJob {
		t.Helper()
		res, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: "both", Tokenizer: "t", Seed: 5, Limits: l})
		if err != nil {
			t.Fatal(err)
		}
		var jobs []AppendJob
		for _, sj := range res.Shards {
			out, done, err := p.Shard(ctx, sj, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !done {
				jobs = append(jobs, out)
			}
		}
		return jobs
	}
	// Both planned and tokenized before any append, as two plans queued
	// at once are.
	small, whole := shards(Limits{MaxTokens: 10}), shards(Limits{})
	var stop *StopError
	for _, j := range small {
		if _, err := p.Append(ctx, j, nil); err != nil && !errors.As(err, &stop) {
			t.Fatalf("the limited ingest's append of %s: %v", j.Source, err)
		}
	}
	for _, j := range whole {
		if _, err := p.Append(ctx, j, nil); err != nil {
			t.Fatalf("the unlimited ingest's append of %s after the limited one's: %v", j.Source, err)
		}
	}
	sameDocs(t, storeDocs(t, tok, filepath.Join(p.StoresDir, "both"), all), all)
}
