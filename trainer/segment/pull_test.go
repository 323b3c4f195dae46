package segment

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

// faultyS3 is kiln's S3 store on a real versitygw through an S3Faults
// proxy (through), the proxy, and the store without it (direct), which
// sees what the server holds.
func faultyS3(t *testing.T) (through Objects, faults *testsvc.S3Faults, direct Objects) {
	t.Helper()
	srv := testsvc.S3(t)
	faults = srv.Faults(t)
	through, err := store.NewS3(store.S3Options{Endpoint: faults.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	direct, err = newS3Store(srv)
	if err != nil {
		t.Fatal(err)
	}
	return through, faults, direct
}

// digitAfter is the offset in b of the first digit after key: one whose
// lowest bit flipped is another digit, so the JSON stays valid and its
// number changes.
func digitAfter(t *testing.T, b []byte, key string) int64 {
	t.Helper()
	i := bytes.Index(b, []byte(key))
	if i < 0 {
		t.Fatalf("%s not in %s", key, b)
	}
	for j := i + len(key); j < len(b); j++ {
		if b[j] >= '0' && b[j] <= '9' {
			return int64(j)
		}
	}
	t.Fatalf("no digit after %s in %s", key, b)
	return 0
}

// readRecords parses a metrics.jsonl's records up to step.
func readRecords(t *testing.T, b []byte, step int) []results.Record {
	t.Helper()
	recs, err := results.ReadMetrics(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out []results.Record
	for _, r := range recs {
		if r.Step <= step {
			out = append(out, r)
		}
	}
	return out
}

// trainedToStep4 trains a first segment of run name (8 steps in all) to
// step 4 through through, checkpointed and uploaded at steps 2 and 4.
func trainedToStep4(t *testing.T, ctx context.Context, name string, through Objects) (Params, *losses) {
	t.Helper()
	rdb := newRedis(t)
	want := referenceLosses(t, ctx, rdb, 8)
	run := testRun(name, 8)
	run.Segment.MaxSteps = 4
	if out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	return Params{Run: run, Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-b"}, want
}

// A byte of trainer_state.json or of the checkpoint's metrics.jsonl changed
// on its way from the store (a proxy, a faulty link) is caught by the hash
// its marker lists and downloaded again, where the size alone let it
// through: the changed data position skipped data, and the changed loss
// rewrote the run's history for good. The resume goes on with the bytes
// uploaded: its losses are the uninterrupted run's, and its history,
// here and in results/, is the one the first segment wrote.
func TestTrainerStateAndMetricsChangedInTransitAreDownloadedAgain(t *testing.T) {
	ctx := context.Background()
	through, faults, direct := faultyS3(t)
	p, want := trainedToStep4(t, ctx, "cursor", through)
	prefix := checkpointKey("cursor", 4)
	state := readObject(t, ctx, direct, prefix+trainer.StateFile)
	hist := readObject(t, ctx, direct, prefix+results.MetricsFile)
	faults.Add(testsvc.Fault{Method: "GET", Path: prefix + trainer.StateFile, Action: testsvc.Flip, At: digitAfter(t, state, `"data_cursor":`), Count: 1})
	faults.Add(testsvc.Fault{Method: "GET", Path: prefix + results.MetricsFile, Action: testsvc.Flip, At: digitAfter(t, hist, `"loss":`), Count: 1})

	core, logs := observer.New(zap.WarnLevel)
	var second losses
	p.Dir, p.Log, p.Progress = t.TempDir(), zap.New(core), second.hook
	out, err := Run(ctx, p)
	if err != nil || out.ResumedFrom != 4 || out.ResumeSource != "object storage" || !out.Done {
		t.Fatalf("segment on a new disk: %+v, %v; want it to resume from step 4 in object storage and finish", out, err)
	}
	if faults.Acted(trainer.StateFile) != 1 || faults.Acted(results.MetricsFile) != 1 {
		t.Fatalf("the flips acted on %d and %d downloads; want one each", faults.Acted(trainer.StateFile), faults.Acted(results.MetricsFile))
	}
	for step := 5; step <= 8; step++ {
		if second.m[step] != want.m[step] {
			t.Errorf("step %d: loss %v, uninterrupted %v: the resume read another data position", step, second.m[step], want.m[step])
		}
	}
	uploaded := readRecords(t, hist, 4)
	local, err := os.ReadFile(filepath.Join(RunDir(p.Dir, "cursor"), results.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	if got := readRecords(t, local, 4); !reflect.DeepEqual(got, uploaded) {
		t.Errorf("the history up to step 4 on the new disk is %+v; the first segment wrote %+v", got, uploaded)
	}
	if got := readRecords(t, readObject(t, ctx, direct, ResultsPrefix("cursor")+results.MetricsFile), 4); !reflect.DeepEqual(got, uploaded) {
		t.Errorf("the history up to step 4 in results/ is %+v; the first segment wrote %+v", got, uploaded)
	}
	if w := logs.FilterMessageSnippet("downloading it again").All(); len(w) == 0 {
		t.Errorf("warnings %v; want one saying the download is made again", logs.All())
	}
	if w := logs.FilterMessageSnippet("passed over").All(); len(w) != 0 {
		t.Errorf("warnings %v; want no checkpoint passed over", w)
	}
}

// A checkpoint's file whose bytes change once on their way from the store
// is downloaded again, and the segment resumes from that checkpoint,
// where it passed it over at once for the one before (thousands of steps
// trained again at the pilot's interval), calling it damaged in object
// storage.
func TestACheckpointChangedInTransitIsDownloadedAgainNotPassedOver(t *testing.T) {
	ctx := context.Background()
	through, faults, _ := faultyS3(t)
	p, want := trainedToStep4(t, ctx, "transit", through)
	faults.Add(testsvc.Fault{Method: "GET", Path: checkpointKey("transit", 4) + trainer.ModelFile, Action: testsvc.Flip, At: -1, Count: 1})

	core, logs := observer.New(zap.WarnLevel)
	var second losses
	p.Dir, p.Log, p.Progress = t.TempDir(), zap.New(core), second.hook
	out, err := Run(ctx, p)
	if err != nil || out.ResumedFrom != 4 || out.ResumeSource != "object storage" || !out.Done {
		t.Fatalf("segment on a new disk: %+v, %v; want it to resume from step 4 in object storage and finish", out, err)
	}
	if n := faults.Acted(trainer.ModelFile); n != 1 {
		t.Fatalf("the flip acted on %d downloads; want one", n)
	}
	again := logs.FilterMessageSnippet("downloading it again").All()
	if len(again) != 1 || again[0].ContextMap()["step"] != int64(4) || !strings.Contains(again[0].ContextMap()["error"].(string), trainer.ModelFile) {
		t.Errorf("warnings %v; want one naming step 4 and %s", logs.All(), trainer.ModelFile)
	}
	if w := logs.FilterMessageSnippet("passed over").All(); len(w) != 0 {
		t.Errorf("warnings %v; want no checkpoint passed over", w)
	}
	for step := 5; step <= 8; step++ {
		if second.m[step] != want.m[step] {
			t.Errorf("step %d: loss %v, uninterrupted %v", step, second.m[step], want.m[step])
		}
	}
}

// A marker written by an earlier kiln lists sizes and no hashes: it still
// reads, its files are checked against trainer_state.json's hashes, and one
// that does not match is downloaded again, every file with it (the marker
// does not say which one changed).
func TestAMarkerOfAnEarlierKilnStillReads(t *testing.T) {
	ctx := context.Background()
	through, faults, direct := faultyS3(t)
	p, _ := trainedToStep4(t, ctx, "older", through)
	key := checkpointKey("older", 4) + MarkerFile
	var m map[string]any
	if err := json.Unmarshal(readObject(t, ctx, direct, key), &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "sha256")
	b, _ := json.MarshalIndent(m, "", "  ")
	putObject(t, ctx, direct, key, b)
	faults.Add(testsvc.Fault{Method: "GET", Path: checkpointKey("older", 4) + trainer.ModelFile, Action: testsvc.Flip, At: -1, Count: 1})

	p.Dir = t.TempDir()
	out, err := Run(ctx, p)
	if err != nil || out.ResumedFrom != 4 || out.ResumeSource != "object storage" || !out.Done {
		t.Fatalf("segment on a new disk: %+v, %v; want it to resume from step 4, whose marker lists no hashes", out, err)
	}
	if n := faults.Acted(trainer.ModelFile); n != 1 {
		t.Fatalf("the flip acted on %d downloads; want one", n)
	}
}

// The marker lists every file's SHA-256, that of the bytes uploaded:
// trainer_state.json's and metrics.jsonl's, which trainer_state.json does
// not list, included.
func TestTheMarkerListsEveryFilesHash(t *testing.T) {
	ctx := context.Background()
	_, _, direct := faultyS3(t)
	run := testRun("hashes", 4)
	rdb := newRedis(t)
	if out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: direct, OpenData: openStream}); err != nil || out.Uploaded != 4 {
		t.Fatalf("segment: %+v %v", out, err)
	}
	prefix := checkpointKey("hashes", 4)
	var m Marker
	if err := json.Unmarshal(readObject(t, ctx, direct, prefix+MarkerFile), &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Files[results.MetricsFile]; !ok || len(m.SHA256) != len(m.Files) {
		t.Fatalf("marker lists files %v and hashes %v; want a hash for each, metrics.jsonl among them", m.Files, m.SHA256)
	}
	for name := range m.Files {
		sum := sha256.Sum256(readObject(t, ctx, direct, prefix+name))
		if got := hex.EncodeToString(sum[:]); m.SHA256[name] != got {
			t.Errorf("%s: the marker says SHA-256 %s, the stored object's is %s", name, m.SHA256[name], got)
		}
	}
}

// Where every download of every checkpoint differs from its marker (a
// proxy that changes what it passes on), the downloads are made several
// times, and the segment, with no intact checkpoint on its disk, stops
// without calling the stored copies damaged: its error says how to check
// them first, where it said to delete checkpoints/<run>/, here an intact
// run. Downloads that differ from one another are said to change on their
// way here. Once the proxy is mended, the run resumes from its newest.
func TestEveryDownloadChangedStopsTheSegmentSayingToCheckTheStoredCopies(t *testing.T) {
	ctx := context.Background()
	through, faults, _ := faultyS3(t)
	p, _ := trainedToStep4(t, ctx, "proxied", through)
	// Step 4's weights change at another byte on each download; step 2's
	// alike each time.
	for _, at := range []int64{100, 200, 300} {
		faults.Add(testsvc.Fault{Method: "GET", Path: checkpointKey("proxied", 4) + trainer.ModelFile, Action: testsvc.Flip, At: at, Count: 1})
	}
	faults.Add(testsvc.Fault{Method: "GET", Path: checkpointKey("proxied", 2) + trainer.ModelFile, Action: testsvc.Flip, At: -1})

	p.Dir = t.TempDir()
	out, err := Run(ctx, p)
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("segment on a new disk: %+v, %v; want it stopped for good", out, err)
	}
	for _, want := range []string{
		"no checkpoint of it in object storage downloaded intact (steps [2 4]",
		"downloaded 3 times, and model.safetensors came with other bytes from one download to the next",
		"Before deleting anything, check the stored copies",
		"'mc cat ALIAS/BUCKET/" + checkpointKey("proxied", 4) + "FILE | sha256sum'",
		"Where they match, the stored copies are intact and something between this worker and the store (a proxy, a faulty link) changes what it downloads",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\nlacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "is damaged") {
		t.Errorf("error %q calls the stored copies damaged", err)
	}
	for _, step := range []int{2, 4} {
		if n := faults.Acted(checkpointKey("proxied", step) + trainer.ModelFile); n != pullAttempts {
			t.Errorf("step %d's weights downloaded %d times; want %d", step, n, pullAttempts)
		}
	}

	faults.Clear()
	p.Dir = t.TempDir()
	if out, err := Run(ctx, p); err != nil || out.ResumedFrom != 4 || out.ResumeSource != "object storage" || !out.Done {
		t.Fatalf("segment once the proxy is mended: %+v, %v; want it to resume from step 4 and finish", out, err)
	}
}
