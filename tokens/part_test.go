package tokens

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An input may be appended in parts, end to end from its first record:
// each part is appended once (a retry is a no-op), a part that would pass
// over records or take them again is refused, the store says how much of
// the input it holds, and the manifest is version 2 while it records
// parts, version 1 (which builds before parts read) while it does not.
func TestPartsOfAnInput(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	appendIDs(t, a, "whole", shardIDs(1, 40, 1000, 0))
	if v := manifestVersion(t, dir); v != 1 {
		t.Fatalf("a store of whole inputs is written as version %d, want 1", v)
	}

	part := func(from, to int64, seed uint64, skips ...Skipped) (AppendResult, error) {
		ids := shardIDs(seed, 30, 1000, 0)
		return a.Append(ctx, ShardInfo{ID: "f", Source: "f.parquet", Part: Part{From: from, To: to}, Skipped: skips}, bytes.NewReader(Encode(nil, a.m.Dtype, ids)))
	}
	if _, err := part(0, 10, 2, Skipped{ID: "f", Reason: "corrupt-file"}); err == nil {
		t.Fatal("a first part recorded its input as left out")
	}
	if _, err := part(5, 10, 2); err == nil || !strings.Contains(err.Error(), "append the input from record 0") {
		t.Fatalf("a first part from record 5: %v; want it refused", err)
	}
	first, err := part(0, 10, 2, Skipped{ID: "f", Reason: "empty-document", Count: 2})
	if err != nil || first.Duplicate || first.Shard.Part != (Part{From: 0, To: 10}) {
		t.Fatalf("first part: %+v, %v", first, err)
	}
	if v := manifestVersion(t, dir); v != Version {
		t.Fatalf("a store with a part is written as version %d, want %d", v, Version)
	}
	if in := a.m.Input("f"); !in.Partial() || in.Next != 10 || in.Tokens != 30 || in.Shards != 1 {
		t.Fatalf("input after its first part: %+v", in)
	}
	// A retry of the committed part is a no-op; another id at its place
	// is refused.
	if again, err := part(0, 10, 2); err != nil || !again.Duplicate || a.m.Tokens != 70 {
		t.Fatalf("the first part again: %+v, %v (%d tokens)", again, err, a.m.Tokens)
	}
	if _, err := part(0, 12, 3); err == nil {
		t.Fatal("another first part with other ids was taken")
	}
	for _, c := range []struct {
		from, to int64
		why      string
	}{{8, 0, "up to 10"}, {12, 0, "up to 10"}, {10, 9, "no part of an input"}} {
		if _, err := part(c.from, c.to, 4); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Fatalf("part %d-%d: %v; want %q", c.from, c.to, err, c.why)
		}
	}
	if _, err := a.Append(ctx, ShardInfo{ID: "f"}, bytes.NewReader(Encode(nil, a.m.Dtype, shardIDs(5, 10, 1000, 0)))); err == nil {
		t.Fatal("the whole input was appended over its first part")
	}
	if err := a.Skip(ctx, Skipped{ID: "f", Reason: "corrupt-file"}); err == nil {
		t.Fatal("an input in part was recorded as skipped whole")
	}
	if _, err := part(10, 0, 5, Skipped{ID: "f", Reason: "empty-document", Count: 1}); err == nil || !strings.Contains(err.Error(), "first record (10)") {
		t.Fatalf("the rest with a record of documents left out of the first part: %v", err)
	}
	if _, err := part(10, 20, 5, Skipped{ID: "f", Reason: "empty-document", Count: 1, From: 10}); err != nil {
		t.Fatal(err)
	}
	rest, err := part(20, 0, 6, Skipped{ID: "f", Reason: "empty-document", Count: 3, From: 20})
	if err != nil || rest.Shard.Offset != 100 {
		t.Fatalf("the rest: %+v, %v", rest, err)
	}
	if in := a.m.Input("f"); !in.Whole || in.Shards != 3 || in.Tokens != 90 {
		t.Fatalf("input once whole: %+v", in)
	}
	if _, err := part(30, 0, 7); err == nil || !strings.Contains(err.Error(), "holds all of its input") {
		t.Fatalf("a part after the end: %v", err)
	}
	// Each part's count of documents left out stands.
	var counts []int64
	for _, s := range a.m.Skipped {
		counts = append(counts, s.Count)
	}
	if len(counts) != 3 || counts[0]+counts[1]+counts[2] != 6 {
		t.Fatalf("documents left out: %+v", a.m.Skipped)
	}

	// The store reopens and reads as it was written.
	a.Close()
	m, err := ReadManifest(dir)
	if err != nil || m.Tokens != 130 || len(m.Shards) != 4 {
		t.Fatalf("reopened: %+v, %v", m, err)
	}
	if got := readAll(t, dir); len(got) != 130 {
		t.Fatalf("read %d tokens", len(got))
	}
}

// A manifest whose parts overlap, leave records out, or follow the whole
// input is damaged; one of version 1 that records parts is misread.
func TestManifestPartsAreChecked(t *testing.T) {
	base := Manifest{Format: Format, Version: Version, Dtype: Uint16, Tokenizer: testTok}
	for _, c := range []struct {
		name   string
		shards []Shard
		want   string
	}{
		{"a gap", []Shard{{ID: "f", Part: Part{0, 5}}, {ID: "f", Part: Part{6, 0}}}, "end at record 5"},
		{"an overlap", []Shard{{ID: "f", Part: Part{0, 5}}, {ID: "f", Part: Part{4, 0}}}, "end at record 5"},
		{"a first part that does not start the input", []Shard{{ID: "f", Part: Part{3, 5}}}, "end at record 0"},
		{"a part after the end", []Shard{{ID: "f", Part: Part{0, 5}}, {ID: "f", Part: Part{5, 0}}, {ID: "f", Part: Part{5, 0}}}, "whole already"},
		{"a whole input after a part", []Shard{{ID: "f", Part: Part{0, 5}}, {ID: "f"}}, "whole after a part"},
		{"an input twice", []Shard{{ID: "f"}, {ID: "f"}}, "recorded twice"},
		{"a part that ends where it starts", []Shard{{ID: "f", Part: Part{0, 0}}, {ID: "g", Part: Part{0, 0}}, {ID: "h", Part: Part{4, 4}}}, "end at record 0"},
	} {
		m := base
		m.Shards = c.shards
		if err := m.validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want %q", c.name, err, c.want)
		}
	}
	m := base
	m.Version = 1
	m.Shards = []Shard{{ID: "f", Part: Part{0, 5}}}
	if err := m.validate(); err == nil || !strings.Contains(err.Error(), "need version 2") {
		t.Errorf("parts in a version 1 manifest: %v", err)
	}
	m.Shards = []Shard{{ID: "f", Part: Part{0, 5}}, {ID: "f", Part: Part{5, 9}}, {ID: "f", Part: Part{9, 0}}}
	m.Version = Version
	if err := m.validate(); err != nil {
		t.Errorf("parts end to end: %v", err)
	}
}

// A manifest of whole inputs has no part fields at all: what an earlier
// build wrote and reads.
func TestAManifestOfWholeInputsIsVersion1(t *testing.T) {
	dir := t.TempDir()
	a := openTestAppender(t, dir, testTok)
	appendIDs(t, a, "a", shardIDs(1, 20, 1000, 0))
	a.Close()
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"part"`) || strings.Contains(string(b), `"from"`) {
		t.Fatalf("a manifest of whole inputs names parts:\n%s", b)
	}
}

func manifestVersion(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m.Version
}
