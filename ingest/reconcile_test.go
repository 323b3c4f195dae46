package ingest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
)

// A watch of the stores mends the status of a store that went (its
// directory or its manifest deleted), whose directory was replaced, that
// came back, or over which a smaller backup was written in place, since it
// last looked, also one made and deleted between two looks that an append
// told it of; a store that stays, or appears with its status published,
// is left alone; the stores' directory gone for a moment clears nothing;
// and after Stop nothing is mended.
func TestAWatchMendsTheStatusOfAStoreThatWent(t *testing.T) {
	ctx := context.Background()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir()}
	fill := func(name string, ids ...string) { fillStore(t, p, name, true, ids...) }
	done := func(name string) string {
		t.Helper()
		st, err := p.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(st.Done, ",")
	}
	check := func(w *StoresWatch, want ...string) { t.Helper(); checkMends(t, w, want...) }

	for _, name := range []string{"kept", "gone", "nomanifest", "replaced"} {
		fill(name, "a", "b")
	}
	w := p.WatchStores()
	fill("new", "a")
	check(w) // nothing went
	os.RemoveAll(filepath.Join(p.StoresDir, "gone"))
	os.Remove(filepath.Join(p.StoresDir, "nomanifest", tokens.ManifestFile))
	os.Rename(filepath.Join(p.StoresDir, "replaced"), filepath.Join(t.TempDir(), "old"))
	fill("replaced", "c")
	check(w, "gone", "nomanifest") // the other replaced one's append published its status
	for name, want := range map[string]string{"kept": "a,b", "gone": "", "nomanifest": "", "replaced": "c", "new": "a"} {
		if got := done(name); got != want {
			t.Errorf("store %s's status lists %q; want %q", name, got, want)
		}
	}

	// A store replaced by one whose status no append published.
	os.Rename(filepath.Join(p.StoresDir, "kept"), filepath.Join(t.TempDir(), "old"))
	fillStore(t, p, "kept", false, "d")
	// A store made and deleted between two looks is known to the watch
	// only by an append's word.
	fill("brief", "a")
	os.RemoveAll(filepath.Join(p.StoresDir, "brief"))
	check(w, "kept")
	if got := done("kept"); got != "d" {
		t.Errorf("the store replaced has a status listing %q; want d", got)
	}
	fill("brief", "a")
	w.Saw("brief")
	os.RemoveAll(filepath.Join(p.StoresDir, "brief"))
	check(w, "brief")
	check(w)

	// A store moved away and back: its status is cleared, then says again
	// what it holds.
	fill("back", "a", "b")
	w.Saw("back")
	check(w)
	away := filepath.Join(t.TempDir(), "back")
	os.Rename(filepath.Join(p.StoresDir, "back"), away)
	check(w, "back")
	os.Rename(away, filepath.Join(p.StoresDir, "back"))
	check(w, "back")
	if got := done("back"); got != "a,b" {
		t.Errorf("the store moved back has a status listing %q; want a,b", got)
	}

	// A smaller backup written over a store in place, its directory and
	// files the same (as a copy into it, or a directory made again on the
	// freed inode, leaves them): its manifest's size and time tell.
	small := filepath.Join(t.TempDir(), "small")
	fillStore(t, &Pipeline{StoresDir: filepath.Dir(small)}, "small", false, "a")
	for _, f := range []string{tokens.ManifestFile, tokens.TokensFile} {
		data, err := os.ReadFile(filepath.Join(small, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.StoresDir, "back", f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check(w, "back")
	if got := done("back"); got != "a" {
		t.Errorf("the store a smaller backup was written over has a status listing %q; want a", got)
	}

	// The stores' directory gone for a moment (a disk unmounted): no
	// status is cleared, and none is once it is back.
	gone := filepath.Join(t.TempDir(), "stores")
	os.Rename(p.StoresDir, gone)
	if rs, err := w.Check(ctx); err == nil || len(rs) != 0 || !strings.Contains(err.Error(), "their statuses are left as they are") {
		t.Fatalf("Check with the stores' directory gone: %v, %v; want an error and nothing mended", rs, err)
	}
	os.Rename(gone, p.StoresDir)
	check(w)
	if got := done("kept"); got != "d" {
		t.Errorf("after the stores' directory came back, store kept's status lists %q; want d", got)
	}

	w.Stop()
	os.RemoveAll(filepath.Join(p.StoresDir, "new"))
	check(w)
	if got := done("new"); got != "a" {
		t.Errorf("a watch stopped mended a status: %q", got)
	}
}

// checkMends runs w.Check and fails t unless it mends the stores want,
// in order, and no error; it returns what it mended.
func checkMends(t *testing.T, w *StoresWatch, want ...string) []Reconciled {
	t.Helper()
	rs, err := w.Check(context.Background())
	var got []string
	for _, r := range rs {
		got = append(got, r.Store)
	}
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("Check mended %v, %v; want %v", got, err, want)
	}
	return rs
}

// fillStore appends files ids to store name of p, one token each, as
// appends leave it, and publishes the status that says so where publish
// says to (not: a store copied here with no append to publish it).
func fillStore(t *testing.T, p *Pipeline, name string, publish bool, ids ...string) {
	t.Helper()
	ctx := context.Background()
	tok := tokens.Tokenizer{Name: "t", SHA256: strings.Repeat("ab", 32), VocabSize: 300, EOS: 0}
	a, err := tokens.OpenAppender(ctx, filepath.Join(p.StoresDir, name), tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, id := range ids {
		if _, err := a.Append(ctx, tokens.ShardInfo{ID: id}, bytes.NewReader([]byte{1, 0, 0, 0})); err != nil {
			t.Fatal(err)
		}
	}
	if publish {
		if _, err := p.publishStatus(ctx, name, a.Manifest(), Limits{}, Limits{}); err != nil {
			t.Fatal(err)
		}
	}
}

// ReconcileAll, a start's mending of every status, that fails is left
// pending and says its error once while it stays the same; once object
// storage answers it mends the statuses and is pending no more. After
// Stop it mends nothing.
func TestReconcileAllFailedIsPendingUntilItSucceeds(t *testing.T) {
	ctx := context.Background()
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir()}
	// The status of a store this disk lacks.
	fillStore(t, p, "gone", true, "a")
	os.RemoveAll(filepath.Join(p.StoresDir, "gone"))
	w := p.WatchStores()
	if w.Pending() {
		t.Fatal("a new watch is pending")
	}
	w.ReconcileLater()
	if !w.Pending() {
		t.Fatal("ReconcileLater left nothing pending")
	}
	srv.Stop()
	if _, err := w.ReconcileAll(ctx); err == nil || !w.Pending() {
		t.Fatalf("ReconcileAll with object storage down: %v, pending %v; want an error, pending", err, w.Pending())
	}
	if _, err := w.ReconcileAll(ctx); err != nil || !w.Pending() {
		t.Fatalf("ReconcileAll failing again the same way: %v, pending %v; want no error said twice, pending", err, w.Pending())
	}
	srv.Start()
	rs, err := w.ReconcileAll(ctx)
	if err != nil || len(rs) != 1 || rs[0].Store != "gone" || w.Pending() {
		t.Fatalf("ReconcileAll with object storage back: mended %+v, %v, pending %v; want store gone mended, nothing pending", rs, err, w.Pending())
	}

	// A store whose manifest does not read here (another release's, not
	// a damaged one: TestADamagedStoreIsMarkedUntilItIsMendedOrDeleted)
	// fails alone: named once, left to the next Check, nothing pending;
	// mended there once it reads.
	fillStore(t, p, "unread", true, "a")
	manifest := filepath.Join(p.StoresDir, "unread", tokens.ManifestFile)
	good, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(good, []byte(`"version": 1,`)) {
		t.Fatalf("the manifest names no version 1: %s", good)
	}
	if err := os.WriteFile(manifest, bytes.Replace(good, []byte(`"version": 1,`), []byte(`"version": 9,`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ReconcileAll(ctx); err == nil || !strings.Contains(err.Error(), "unread") || w.Pending() {
		t.Fatalf("ReconcileAll with a store that does not read: %v, pending %v; want the store named, nothing pending", err, w.Pending())
	}
	if rs, err := w.Check(ctx); len(rs) != 0 || err != nil {
		t.Fatalf("Check with the store still unread: %+v, %v; want nothing mended, its error not said twice", rs, err)
	}
	// Put back from a backup, after its status was cleared.
	os.WriteFile(manifest, good, 0o644)
	if err := objects.Delete(ctx, StatusKey("unread")); err != nil {
		t.Fatal(err)
	}
	if rs, err := w.Check(ctx); err != nil || len(rs) != 1 || rs[0].Store != "unread" {
		t.Fatalf("Check with the store readable again: %+v, %v; want its status mended", rs, err)
	}

	fillStore(t, p, "later", true, "a")
	os.RemoveAll(filepath.Join(p.StoresDir, "later"))
	w.Stop()
	if rs, err := w.ReconcileAll(ctx); len(rs) != 0 || err != nil {
		t.Fatalf("ReconcileAll after Stop: %+v, %v; want nothing mended", rs, err)
	}
	if st, err := p.Status(ctx, "later"); err != nil || len(st.Done) != 1 {
		t.Fatalf("after Stop the status of store later: %+v, %v; want it as it was", st, err)
	}
}

// A store whose tokens.bin was cut short or deleted outside kiln, with its
// manifest whole, is marked damaged in its status, by a worker's start
// and by a watch that sees the file shrink: its files stay listed, a plan
// into it is refused for good and says what to do, where it would take
// them for stored and report the ingest done. The file put back in place
// clears the mark; the store deleted clears its status.
func TestADamagedStoreIsMarkedUntilItIsMendedOrDeleted(t *testing.T) {
	ctx := context.Background()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir()}
	status := func(name string) StoreStatus {
		t.Helper()
		st, err := p.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	check := func(w *StoresWatch, want ...string) []Reconciled { t.Helper(); return checkMends(t, w, want...) }
	fillStore(t, p, "cut", true, "a", "b")
	fillStore(t, p, "whole", true, "a")
	bin := filepath.Join(p.StoresDir, "cut", tokens.TokensFile)
	good, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}

	// Cut before a worker's start: its mending of every status marks it.
	if err := os.Truncate(bin, 3); err != nil {
		t.Fatal(err)
	}
	w := p.WatchStores()
	rs, err := w.ReconcileAll(ctx)
	if err != nil || len(rs) != 1 || rs[0].Store != "cut" {
		t.Fatalf("ReconcileAll mended %+v, %v; want store cut", rs, err)
	}
	dir := filepath.Join(p.StoresDir, "cut")
	for _, want := range []string{"tokens.bin is truncated (3 of 8 bytes)", "delete " + dir + " on ", "re-ingest it"} {
		if !strings.Contains(rs[0].Damaged, want) {
			t.Errorf("Reconciled.Damaged %q does not say %q", rs[0].Damaged, want)
		}
	}
	st := status("cut")
	if st.Damaged != rs[0].Damaged || strings.Join(st.Done, ",") != "a,b" {
		t.Errorf("the status of the cut store: damaged %q, files %v; want %q, its files a,b kept", st.Damaged, st.Done, rs[0].Damaged)
	}
	if st := status("whole"); st.Damaged != "" {
		t.Errorf("a whole store's status says it is damaged: %q", st.Damaged)
	}
	if d := w.Damaged(); len(d) != 1 || d["cut"] != rs[0].Damaged {
		t.Errorf("the watch's damaged stores: %v; want cut's", d)
	}
	// Marked once: looks that find it as it was mend nothing.
	if rs, err := w.ReconcileAll(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("ReconcileAll again mended %+v, %v; want nothing", rs, err)
	}
	check(w)

	// A plan into it is refused for good, naming the store and what to do.
	job := PlanJob{Dataset: "local:" + filepath.Join(t.TempDir(), "*.txt"), Store: "cut", Tokenizer: "t"}
	_, err = p.Plan(ctx, job)
	var de *DamagedError
	if !errors.As(err, &de) || !de.BadInput() || !strings.Contains(err.Error(), "token store cut is damaged: tokens.bin is truncated") {
		t.Fatalf("a plan into a damaged store: %v; want a DamagedError naming it", err)
	}

	// Put back in place (the same file, written over): the next look
	// clears the mark.
	if err := os.WriteFile(bin, good, 0o644); err != nil {
		t.Fatal(err)
	}
	check(w, "cut")
	if st := status("cut"); st.Damaged != "" || strings.Join(st.Done, ",") != "a,b" {
		t.Errorf("the store put back: damaged %q, files %v; want no mark, files a,b", st.Damaged, st.Done)
	}
	if d := w.Damaged(); d != nil {
		t.Errorf("the watch's damaged stores once it was put back: %v; want none", d)
	}
	if _, err := p.Plan(ctx, job); errors.As(err, &de) {
		t.Errorf("a plan into the store put back: %v", err)
	}

	// Cut while watched, and a file deleted: each look marks what it
	// finds now.
	if err := os.Truncate(bin, 1); err != nil {
		t.Fatal(err)
	}
	if rs := check(w, "cut"); !strings.Contains(rs[0].Damaged, "(1 of 8 bytes)") {
		t.Errorf("the store cut while watched: %q", rs[0].Damaged)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	if rs := check(w, "cut"); !strings.HasPrefix(rs[0].Damaged, "tokens.bin is missing") {
		t.Errorf("the store whose tokens.bin went: %q", rs[0].Damaged)
	}
	// An append's word leaves the mark as it is.
	w.Saw("cut")
	check(w)
	if d := w.Damaged(); !strings.HasPrefix(d["cut"], "tokens.bin is missing") {
		t.Errorf("the watch's damaged stores after an append's word: %v", d)
	}
	// A manifest that does not parse is damage too.
	manifest := filepath.Join(dir, tokens.ManifestFile)
	if err := os.WriteFile(manifest, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rs := check(w, "cut"); !strings.HasPrefix(rs[0].Damaged, "manifest.json does not parse") {
		t.Errorf("the store whose manifest does not parse: %q", rs[0].Damaged)
	}
	if st := status("cut"); strings.Join(st.Done, ",") != "a,b" {
		t.Errorf("the store whose manifest does not parse: files %v; want a,b kept", st.Done)
	}

	// Deleted, as the mark says to: its status goes, and a plan lists
	// its files again.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	check(w, "cut")
	if st := status("cut"); st.Damaged != "" || len(st.Done) != 0 {
		t.Errorf("the deleted store's status: damaged %q, files %v; want none", st.Damaged, st.Done)
	}
	if d := w.Damaged(); d != nil {
		t.Errorf("the watch's damaged stores once it was deleted: %v; want none", d)
	}
}
