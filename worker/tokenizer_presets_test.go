package worker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/sample"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// A worker whose KILN_DATASETS file is not valid starts, and says so in
// its log naming the variable: the tasks carry the presets they name, so
// it refused to start over a file it has no use for, with a Go field path
// (Handlers.Tokenizers.Presets) in place of the variable. A task that
// carries its preset samples; one queued by an older sched, which carries
// none and is looked up in the file, fails for good, naming the variable
// and what to do.
func TestAWorkerStartsWithAPresetsFileItCannotRead(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "datasets.yaml")
	if err := os.WriteFile(bad, []byte("mine:\n  repo: a/b\n  filez: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KILN_DATASETS", bad)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h, presets := mixedHub(t)
	hc, _ := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 1})
	core, logs := observer.New(zap.WarnLevel)
	var queued []scheduler.Args
	tokenizers := &Tokenizers{Objects: objects, DataDir: t.TempDir(), Hub: hc, Log: zap.New(core),
		Enqueue: func(_ context.Context, a scheduler.Args) error { queued = append(queued, a); return nil }}
	if _, err := New(Params{Redis: asynq.RedisClientOpt{Addr: "127.0.0.1:1"}, Queues: map[string]int{scheduler.QueueIngest: 1},
		Handlers: Handlers{Tokenizers: tokenizers}}); err != nil {
		t.Fatalf("New with a KILN_DATASETS file that is not valid: %v; want it to start", err)
	}
	if warned := logs.FilterMessageSnippet("KILN_DATASETS").All(); len(warned) != 1 || !strings.Contains(warned[0].ContextMap()["error"].(string), `unknown key "filez"`) {
		t.Fatalf("warnings at the start: %v; want one naming KILN_DATASETS, with the file's fault", logs.All())
	}

	tk, err := tokenizers.resolve()
	if err != nil {
		t.Fatal(err)
	}
	a := TokenizerSampleTasks("tok", []sample.Share{{Dataset: "code", Weight: 1}}, 1000, 512, 1, "")[0]
	// As an older sched queued it: no preset carried.
	old := TokenizerSampleTasks("old", []sample.Share{{Dataset: "prose", Weight: 1}}, 1000, 512, 1, "")[0]
	a.Preset = ingest.Carried(presets["code"])
	if err := tk.sample(context.Background(), a); err != nil {
		t.Fatalf("a sample carrying its preset: %v", err)
	}
	if len(queued) != 1 {
		t.Fatalf("the only sample drawn did not queue the training: %v", queued)
	}
	err = tk.sample(context.Background(), old)
	if err == nil || !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "KILN_DATASETS on this worker: "+bad+": not valid preset YAML") ||
		!strings.Contains(err.Error(), "mend the file or unset KILN_DATASETS") || strings.Contains(err.Error(), "Handlers.") {
		t.Fatalf("a sample carrying no preset: %v; want it failed for good, naming KILN_DATASETS and what to do", err)
	}
}

// A worker refused as it starts for what it reads (here the data directory
// its tokenizer tasks keep their downloads in) is told of that input, not
// of a Go field path, which only a missing dependency, the program's
// fault, is named by.
func TestAWorkersStartErrorNamesItsInputNotAField(t *testing.T) {
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	// A file where the downloads' directory goes.
	if err := os.WriteFile(filepath.Join(dataDir, "tmp"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = New(Params{Redis: asynq.RedisClientOpt{Addr: "127.0.0.1:1"}, Queues: map[string]int{scheduler.QueueIngest: 1},
		Handlers: Handlers{Tokenizers: &Tokenizers{Objects: objects, DataDir: dataDir, Presets: map[string]ingest.Preset{},
			Enqueue: func(context.Context, scheduler.Args) error { return nil }}}})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dataDir, "tmp")) || strings.Contains(err.Error(), "Handlers.") {
		t.Fatalf("New over a data directory whose tmp is a file: %v; want its path named, and no field path", err)
	}
}
