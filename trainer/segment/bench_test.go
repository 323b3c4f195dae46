package segment

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
)

// benchCheckpoint writes a checkpoint of the full tiny model (1.26M
// parameters: 15 MB with the Adam moments) and returns its directory and
// size in bytes.
func benchCheckpoint(b *testing.B) (string, int64) {
	b.Helper()
	c := model.Presets["tiny"]
	p := model.InitParams(c, 1)
	o := &model.OptimizerState{Step: 100, M: make([]float32, len(p.Data)), V: make([]float32, len(p.Data))}
	dir, err := trainer.WriteCheckpoint(context.Background(), b.TempDir(), &trainer.Snapshot{Config: c, Params: p, Optimizer: o,
		State: trainer.State{Step: 100, Tokens: 1 << 20, Cursor: json.RawMessage(`{}`), Run: trainer.RunConfig{Model: "tiny"}}})
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		fi, _ := e.Info()
		n += fi.Size()
	}
	return dir, n
}

// BenchmarkPushS3 is the background upload's throughput to versitygw on
// loopback: what bounds how long a SIGTERM grace must be.
func BenchmarkPushS3(b *testing.B) {
	srv := testsvc.S3(b)
	s3, err := newS3Store(srv)
	if err != nil {
		b.Fatal(err)
	}
	dir, n := benchCheckpoint(b)
	b.SetBytes(n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Push(context.Background(), s3, nil, fmt.Sprintf("bench-%d", i), dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPullS3 is the download a worker on a fresh disk pays to resume.
func BenchmarkPullS3(b *testing.B) {
	srv := testsvc.S3(b)
	s3, err := newS3Store(srv)
	if err != nil {
		b.Fatal(err)
	}
	dir, n := benchCheckpoint(b)
	if _, err := Push(context.Background(), s3, nil, "bench", dir); err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	b.SetBytes(n)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Pull(context.Background(), s3, "bench", 100, filepath.Join(root, fmt.Sprint(i))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSegmentStep is the time per training step of a segment that
// checkpoints every 2 steps, with the uploads to versitygw ("s3") and
// without object storage ("local"): the difference is what uploading costs
// the training loop.
func BenchmarkSegmentStep(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: testsvc.Redis(b)})
	defer rdb.Close()
	srv := testsvc.S3(b)
	s3, err := newS3Store(srv)
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"local", "s3"} {
		b.Run(mode, func(b *testing.B) {
			run := testRun(fmt.Sprintf("bench-%s-%d", mode, time.Now().UnixNano()), 8*b.N)
			run.CheckpointEvery = 2
			p := Params{Run: run, Dir: b.TempDir(), Redis: rdb, OpenData: openStream}
			if mode == "s3" {
				p.Objects = s3
			}
			b.ResetTimer()
			if _, err := Run(context.Background(), p); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(8*b.N), "ns/step")
		})
	}
}
