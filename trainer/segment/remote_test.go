package segment

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
)

func writeTestCheckpoint(t *testing.T, root string, step int) string {
	t.Helper()
	c, _ := model.Preset("tiny")
	c.VocabSize, c.Layers = 64, 1
	p := model.NewParams(c)
	for i := range p.Data {
		p.Data[i] = float32((i+step)%97) * 0.01
	}
	o := &model.OptimizerState{Step: step, M: make([]float32, len(p.Data)), V: make([]float32, len(p.Data))}
	dir, err := trainer.WriteCheckpoint(context.Background(), root, &trainer.Snapshot{Config: c, Params: p, Optimizer: o,
		Tokenizer: []byte(`{"model":{"type":"BPE"}}`),
		State:     trainer.State{Step: step, Tokens: int64(step) * 100, Cursor: json.RawMessage(`{"pos":1}`), Run: trainer.RunConfig{Model: "tiny"}}})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestPushPullRoundTrip(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	rdb := newRedis(t)
	lock, err := scheduler.AcquireRun(ctx, rdb, "r1", "w", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release(ctx)
	dir := writeTestCheckpoint(t, t.TempDir(), 300)
	m, err := Push(ctx, obj, lock, "r1", dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Step != 300 || m.Token != lock.Token() || m.Files[trainer.ModelFile] == 0 || m.Files[trainer.StateFile] == 0 {
		t.Fatalf("marker %+v", m)
	}
	steps, err := RemoteSteps(ctx, obj, "r1")
	if err != nil || !reflect.DeepEqual(steps, []int{300}) {
		t.Fatalf("remote steps %v %v", steps, err)
	}
	root := t.TempDir()
	got, err := Pull(ctx, obj, "r1", 300, root)
	if err != nil {
		t.Fatal(err)
	}
	if got != filepath.Join(root, "step-0000300") {
		t.Fatalf("pulled into %s", got)
	}
	// Every file arrives byte for byte, and the trainer reads it.
	for name := range m.Files {
		a, _ := os.ReadFile(filepath.Join(dir, name))
		b, _ := os.ReadFile(filepath.Join(got, name))
		if string(a) != string(b) {
			t.Errorf("%s differs after the round trip", name)
		}
	}
	if _, err := trainer.ReadCheckpoint(got, nil); err != nil {
		t.Fatalf("pulled checkpoint unreadable: %v", err)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 1 {
		t.Errorf("pull left temporary files: %v", entries)
	}
}

func TestUploadWithoutMarkerIsNotAResumePoint(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	dir := writeTestCheckpoint(t, t.TempDir(), 100)
	if _, err := Push(ctx, obj, nil, "r", dir); err != nil {
		t.Fatal(err)
	}
	// A newer upload that died before its marker: its files are there.
	dir2 := writeTestCheckpoint(t, t.TempDir(), 200)
	for _, name := range []string{trainer.ModelFile, trainer.ConfigFile} {
		if _, _, err := putFile(ctx, obj, checkpointKey("r", 200)+name, filepath.Join(dir2, name)); err != nil {
			t.Fatal(err)
		}
	}
	steps, err := RemoteSteps(ctx, obj, "r")
	if err != nil || !reflect.DeepEqual(steps, []int{100}) {
		t.Fatalf("want only the complete step 100, got %v %v", steps, err)
	}
	// Nor is it the run's newest step among every run's.
	if _, err := Push(ctx, obj, nil, "q", writeTestCheckpoint(t, t.TempDir(), 300)); err != nil {
		t.Fatal(err)
	}
	if runs, err := RemoteRuns(ctx, obj); err != nil || !reflect.DeepEqual(runs, map[string]int{"r": 100, "q": 300}) {
		t.Fatalf("want runs r at step 100 and q at 300, got %v %v", runs, err)
	}
	if _, err := Pull(ctx, obj, "r", 200, t.TempDir()); err == nil {
		t.Fatal("pulled a checkpoint without its marker")
	}
}

func TestStaleWorkerCannotMarkComplete(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	rdb := newRedis(t)
	stale, err := scheduler.AcquireRun(ctx, rdb, "r", "old", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, scheduler.RunLockKey("r")) // its lease ran out
	fresh, err := scheduler.AcquireRun(ctx, rdb, "r", "new", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Release(ctx)
	_, err = Push(ctx, obj, stale, "r", writeTestCheckpoint(t, t.TempDir(), 500))
	if !errors.Is(err, scheduler.ErrRunLockLost) {
		t.Fatalf("stale push: want scheduler.ErrRunLockLost, got %v", err)
	}
	if steps, _ := RemoteSteps(ctx, obj, "r"); len(steps) != 0 {
		t.Fatalf("a stale worker marked %v complete", steps)
	}
}

func TestKeep(t *testing.T) {
	steps := []int{1000, 2000, 3000, 4000, 5000, 6000, 7000}
	got := Keep(steps, 1000, 2, 3)
	want := map[int]bool{3000: true, 6000: true, 7000: true}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("keep %v, want %v", got, want)
	}
	if got := Keep(steps, 1000, 10, 0); len(got) != len(steps) {
		t.Fatalf("keep_last beyond the count keeps all: %v", got)
	}
}

func TestPruneAppliesRetentionMarkerFirst(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	root := t.TempDir()
	for _, s := range []int{10, 20, 30, 40, 50} {
		if _, err := Push(ctx, obj, nil, "r", writeTestCheckpoint(t, root, s)); err != nil {
			t.Fatal(err)
		}
	}
	// An abandoned upload at step 35 (no marker), older than the newest.
	if err := obj.Put(ctx, checkpointKey("r", 35)+trainer.ModelFile, strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	deleted, err := Prune(ctx, obj, "r", 50, 10, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(deleted, []int{10, 30, 35}) {
		t.Fatalf("deleted %v, want 10, 30 and the abandoned 35", deleted)
	}
	steps, _ := RemoteSteps(ctx, obj, "r")
	if !reflect.DeepEqual(steps, []int{20, 40, 50}) {
		t.Fatalf("kept %v, want 20 (every 2nd) and the last two", steps)
	}
	objs, _ := obj.List(ctx, CheckpointPrefix("r"))
	for _, o := range objs {
		k := o.Key
		for _, gone := range []string{"step-0000010/", "step-0000030/", "step-0000035/"} {
			if strings.Contains(k, gone) {
				t.Errorf("%s left behind", k)
			}
		}
	}
}
