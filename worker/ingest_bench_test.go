package worker

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/parquet-go/parquet-go"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// benchEnvInt reads a size from the environment, or def.
func benchEnvInt(b *testing.B, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive number of bytes", name, v)
	}
	return n
}

// benchTokenizer is the golden gpt2-style tokenizer (the one the
// tokenizer's own benchmarks and the comparison with HF tokenizers use)
// with <|endoftext|> added after its vocabulary, so that it can fill a store.
func benchTokenizer(b *testing.B) []byte {
	f, err := os.Open("../tokenizer/testdata/gpt2-style.tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	var doc map[string]any
	if err := json.NewDecoder(zr).Decode(&doc); err != nil {
		b.Fatal(err)
	}
	vocab := len(doc["model"].(map[string]any)["vocab"].(map[string]any))
	doc["added_tokens"] = []any{map[string]any{"id": vocab, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
		"rstrip": false, "normalized": false, "special": true}}
	out, err := json.Marshal(doc)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// benchCorpus is the tokenizer's test texts (English, Go, Python), about
// 1 MB, the material the generated files are cut from.
func benchCorpus(b *testing.B) string {
	var all strings.Builder
	for _, name := range []string{"english", "go", "python"} {
		f, err := os.Open("../tokenizer/testdata/" + name + ".txt.gz")
		if err != nil {
			b.Fatal(err)
		}
		zr, err := gzip.NewReader(f)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(&all, zr); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	return all.String()
}

// writeBenchFiles writes zstd-compressed parquet files of about fileBytes
// of text each, total bytes in all, as the hub's datasets ship them: 4 to
// 12 KB documents cut from the corpus at shifting offsets, so pages do not
// repeat, in row groups of 4096 rows. The documents are laid out first;
// the files are then written on every core.
func writeBenchFiles(b *testing.B, dir string, total, fileBytes int64) {
	corpus := benchCorpus(b)
	var files [][]ingestRow
	off := 0
	for written := int64(0); written < total; {
		var rows []ingestRow
		for inFile := int64(0); inFile < fileBytes && written < total; {
			size := 4096 + (off*7919)%8192
			if off+size > len(corpus) {
				off = (off + 4099) % 8192
			}
			rows = append(rows, ingestRow{corpus[off : off+size]})
			off += size + 1
			inFile += int64(size)
			written += int64(size)
		}
		files = append(files, rows)
	}
	write := func(path string, rows []ingestRow) error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		w := parquet.NewGenericWriter[ingestRow](f, parquet.Compression(&parquet.Zstd), parquet.MaxRowsPerRowGroup(4096))
		for len(rows) > 0 {
			n := min(len(rows), 1024)
			if _, err := w.Write(rows[:n]); err != nil {
				return err
			}
			rows = rows[n:]
		}
		if err := w.Close(); err != nil {
			return err
		}
		return f.Close()
	}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	slots := make(chan struct{}, runtime.GOMAXPROCS(0))
	for n, rows := range files {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			errs[n] = write(filepath.Join(dir, fmt.Sprintf("part-%04d.parquet", n)), rows)
			<-slots
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkIngestThroughTheQueue compares ingest of local parquet files end
// to end through the queue (a real redis-server; plan, shard and append
// tasks in one worker process; shard token files through the object store)
// with the tokenizer's own throughput on the same documents, and reports
// the worker process's peak RSS.
//
//	KILN_INGEST_BENCH_BYTES       text to ingest (default 64 MiB; the target is >= 1 GB)
//	KILN_INGEST_BENCH_FILE_BYTES  text per parquet file (default 32 MiB)
//	KILN_INGEST_BENCH_DIR         keep the generated files here between runs
//	KILN_INGEST_BENCH_OBJECTS     "local" for the directory object store, else versitygw
//	KILN_INGEST_BENCH_QUEUES      the worker's queues (default ingest=4,append=2, as
//	                              `sched worker` and compose serve them: the worker
//	                              tokenizes ingest.DefaultTokenizing() files at once
//	                              while the others' uploads complete, and one append
//	                              reads its shard while the other commits)
//	KILN_TEST_S3_PART_SIZE        the worker's multipart part size in bytes (default
//	                              store.DefaultPartSize)
//	KILN_TEST_ENCODERS            the worker's encoding pool (default
//	                              ingest.DefaultEncoders())
//	KILN_TEST_PREFETCH            the largest shard an append reads before it takes
//	                              the store, in bytes (default ingest.DefaultPrefetch;
//	                              -1: every shard streams)
//	KILN_TEST_TOKENIZING          files tokenized at once (default
//	                              ingest.DefaultTokenizing())
//	KILN_TEST_DECODE_AHEAD        the text a file's parquet decoders may hold ahead of
//	                              its tokenization, in bytes (default
//	                              ingest.DefaultDecodeAhead())
//
// Metrics: text-MB/s through the queue, tokenizer-MB/s (EncodeBatch over the
// same documents, 8 MiB batches, reading excluded), pct-of-tokenizer, and
// worker-peak-RSS-MiB.
func BenchmarkIngestThroughTheQueue(b *testing.B) {
	total := benchEnvInt(b, "KILN_INGEST_BENCH_BYTES", 64<<20)
	fileBytes := benchEnvInt(b, "KILN_INGEST_BENCH_FILE_BYTES", 32<<20)
	dir := os.Getenv("KILN_INGEST_BENCH_DIR")
	if dir == "" {
		dir = b.TempDir()
	}
	dir = filepath.Join(dir, fmt.Sprintf("%d-%d", total, fileBytes))
	if _, err := os.Stat(filepath.Join(dir, "done")); err != nil {
		os.RemoveAll(dir)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		writeBenchFiles(b, dir, total, fileBytes)
		os.WriteFile(filepath.Join(dir, "done"), nil, 0o644)
	}
	glob := filepath.Join(dir, "*.parquet")
	tokJSON := benchTokenizer(b)
	tok, err := tokenizer.Parse(tokJSON)
	if err != nil {
		b.Fatal(err)
	}

	textBytes := textOf(b, glob)
	for i := 0; i < b.N; i++ {
		// The tokenizer alone is timed just before and just after the run
		// through the queue, on a 256 MiB sample, and the two rates are
		// averaged: on a shared machine the load drifts within minutes.
		before, cpuBefore := tokenizerAlone(b, tok, glob, 256<<20)
		run := ingestOnce(b, tokJSON, glob)
		secs, cpu, rss, st := run.secs, run.cpu, run.rss, run.st
		after, cpuAfter := tokenizerAlone(b, tok, glob, 256<<20)
		tokRate := (before + after) / 2
		rate := float64(textBytes) / 1e6 / secs
		// CPU time is steadier than wall time under a drifting load: MB of
		// text per CPU-second of the worker process (every stage, the plan
		// and the worker's start included) against the tokenizer's own.
		tokCPU := (cpuBefore + cpuAfter) / 2
		cpuRate := float64(textBytes) / 1e6 / cpu
		b.ReportMetric(cpuRate, "MB/cpu-s")
		b.ReportMetric(tokCPU, "tokenizer-MB/cpu-s")
		b.ReportMetric(100*cpuRate/tokCPU, "cpu-pct-of-tokenizer")
		b.ReportMetric(rate, "text-MB/s")
		b.ReportMetric(tokRate, "tokenizer-MB/s")
		b.ReportMetric(100*rate/tokRate, "pct-of-tokenizer")
		b.ReportMetric(float64(rss)/(1<<20), "worker-peak-RSS-MiB")
		b.ReportMetric(float64(st.Tokens)/secs/1e6, "Mtok/s")
		b.Logf("%d MB of text in %d files: %d tokens in %.1fs through the queue (%.1f MB/s, %.1f MB/cpu-s); tokenizer alone %.1f MB/s before, %.1f after (%.1f and %.1f MB/cpu-s); worker peak RSS %d MiB; GOMAXPROCS %d",
			textBytes/1e6, len(mustGlob(b, glob)), st.Tokens, secs, rate, cpuRate, before, after, cpuBefore, cpuAfter, rss>>20, runtime.GOMAXPROCS(0))
		if run.machine > 0 {
			// Where the machine's cores went while the clock ran: on a
			// machine the worker shares with its object store, the store's
			// CPU comes out of the tokenizer's.
			b.ReportMetric(run.machine/secs, "machine-cores-busy")
			b.ReportMetric(run.objects/secs, "object-store-cores")
			b.Logf("machine: %.1f of %d cores busy on average: worker %.1f, object store %.1f, redis %.2f, the rest (this process, the kernel's own threads, others) %.1f",
				run.machine/secs, runtime.NumCPU(), cpu/secs, run.objects/secs, run.redis/secs, (run.machine-cpu-run.objects-run.redis)/secs)
		}
	}
}

// textOf counts the text bytes of every document of the files.
func textOf(b *testing.B, glob string) int64 {
	var n int64
	for _, path := range mustGlob(b, glob) {
		src, err := ingest.Open(context.Background(), path, ingest.OpenOptions{})
		if err != nil {
			b.Fatal(err)
		}
		err = ingest.Drain(context.Background(), src, func(d ingest.Document) error { n += int64(len(d.Text)); return nil })
		src.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	return n
}

func mustGlob(b *testing.B, glob string) []string {
	m, err := filepath.Glob(glob)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// tokenizerBatchBytes is the text tokenizerAlone hands to EncodeBatch at
// once: large enough to keep every core busy.
const tokenizerBatchBytes = 8 << 20

// tokenizerAlone times EncodeBatch over the documents of the files, up to
// limit bytes of text, in batches of tokenizerBatchBytes, with the reading
// outside the clock (a file at a time, read whole first), and returns MB/s
// and MB per CPU-second.
func tokenizerAlone(b *testing.B, tok *tokenizer.Tokenizer, glob string, limit int64) (float64, float64) {
	var elapsed, cpu time.Duration
	var textBytes int64
	for _, path := range mustGlob(b, glob) {
		if textBytes >= limit {
			break
		}
		// The file is read whole and closed before the clock starts: a
		// parquet source decodes ahead on goroutines of its own, whose CPU
		// and cores must not be counted against the tokenizer.
		src, err := ingest.Open(context.Background(), path, ingest.OpenOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var docs []string
		err = ingest.Drain(context.Background(), src, func(d ingest.Document) error {
			docs = append(docs, d.Text)
			textBytes += int64(len(d.Text))
			if textBytes >= limit {
				return io.EOF
			}
			return nil
		})
		src.Close()
		if err != nil && err != io.EOF {
			b.Fatal(err)
		}
		for len(docs) > 0 {
			n, size := 0, 0
			for n < len(docs) && size < tokenizerBatchBytes {
				size += len(docs[n])
				n++
			}
			start, cpu0 := time.Now(), cpuTime(b)
			tok.EncodeBatch(docs[:n])
			elapsed += time.Since(start)
			cpu += cpuTime(b) - cpu0
			docs = docs[n:]
		}
	}
	return float64(textBytes) / 1e6 / elapsed.Seconds(), float64(textBytes) / 1e6 / cpu.Seconds()
}

// cpuTime is this process's CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ingestRun is what one ingest through the queue took.
type ingestRun struct {
	secs float64 // from enqueue to the last commit
	cpu  float64 // the worker's CPU seconds (its start and exit included)
	rss  int64   // the worker's peak resident set
	st   ingest.StoreStatus
	// CPU seconds over secs, where Linux's /proc says (else 0): every
	// core of the machine, the object store's process and redis's.
	machine, objects, redis float64
}

// ingestOnce runs one ingest of glob through the queue in a worker process
// of its own.
func ingestOnce(b *testing.B, tokJSON []byte, glob string) ingestRun {
	redis := testsvc.StartRedis(b)
	opt, err := asynq.ParseRedisURI(redis.URL(0))
	if err != nil {
		b.Fatal(err)
	}
	c := scheduler.NewClient(opt)
	defer c.Close()
	tmp := b.TempDir()
	queues := os.Getenv("KILN_INGEST_BENCH_QUEUES")
	if queues == "" {
		queues = "ingest=4,append=2"
	}
	env := []string{"KILN_TEST_INGEST_WORKER=" + queues, "KILN_TEST_QUIET=1", "KILN_TEST_REDIS_URL=" + redis.URL(0),
		"KILN_TEST_PROGRESS_EVERY=1s", // the worker's default, not the tests' 1 ms
		"KILN_TEST_STORES=" + filepath.Join(tmp, "stores"), "KILN_TEST_DATA=" + filepath.Join(tmp, "data"), "KILN_TEST_LOCAL_ROOTS=" + filepath.Dir(glob)}
	var objects store.Store
	objectsPid := 0
	if os.Getenv("KILN_INGEST_BENCH_OBJECTS") == "local" {
		dir := filepath.Join(tmp, "objects")
		objects, err = store.NewLocal(dir)
		env = append(env, "KILN_TEST_OBJECTS_DIR="+dir)
	} else {
		s3 := testsvc.S3(b)
		objectsPid = s3.Pid()
		objects, err = store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
		env = append(env, "KILN_TEST_S3_ENDPOINT="+s3.Endpoint, "KILN_TEST_S3_ACCESS="+s3.AccessKey, "KILN_TEST_S3_SECRET="+s3.SecretKey)
	}
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := catalog.New(objects, filepath.Join(tmp, "publisher")).Publish(ctx, "bench-bpe", tokJSON); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	files := len(mustGlob(b, glob))
	machine0, objects0, redis0 := machineCPU(), procCPU(objectsPid), procCPU(redis.Pid())
	start := time.Now()
	if _, err := c.Enqueue(ctx, scheduler.IngestPlan{Dataset: "local:" + glob, Store: "bench", Tokenizer: "bench-bpe"}); err != nil {
		b.Fatal(err)
	}
	pipe := ingest.Pipeline{Objects: objects}
	var st ingest.StoreStatus
	for {
		st, err = pipe.Status(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if len(st.Done) == files {
			break
		}
		if cmd.ProcessState != nil {
			b.Fatal("the worker exited")
		}
		// Each poll reads the status object through the store, on the
		// same cores as the worker: every 100 ms, not faster, so that the
		// watching does not eat into what is measured (a run's end is then
		// seen up to 0.1 s late, against the pipeline).
		time.Sleep(100 * time.Millisecond)
	}
	secs := time.Since(start).Seconds()
	run := ingestRun{secs: secs, st: st}
	if machine0 > 0 {
		run.machine = machineCPU() - machine0
		run.objects = procCPU(objectsPid) - objects0
		run.redis = procCPU(redis.Pid()) - redis0
	}
	if st.Shards != files {
		b.Fatalf("%d of %d files appended", st.Shards, files)
	}
	if _, err := tokens.ReadManifest(filepath.Join(tmp, "stores", "bench")); err != nil {
		b.Fatal(err)
	}
	// The worker's own high-water mark, read before it exits: the child's
	// rusage counts the benchmark process's memory too, since the forked
	// child shares it until exec.
	hwm := peakRSS(cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatalf("worker exit: %v", err)
	}
	rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10 // KiB on Linux
	if hwm > 0 {
		rss = hwm
	}
	run.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	run.rss = rss
	return run
}

// clockTicks is Linux's USER_HZ, the unit of /proc's CPU times: 100 on
// every architecture Go builds for (sysconf is out of reach without cgo).
const clockTicks = 100

// machineCPU is the CPU seconds every core has spent busy since boot
// (user, nice, system, irq, softirq and steal in /proc/stat), or 0 where
// /proc does not say.
func machineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // idle (4) and iowait (5) left out
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		busy += v
	}
	return float64(busy) / clockTicks
}

// procCPU is a process's user and system CPU seconds, from
// /proc/<pid>/stat, or 0.
func procCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0
	}
	return float64(utime+stime) / clockTicks
}

// peakRSS is a process's peak resident set in bytes (VmHWM), or 0 where
// /proc does not say.
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
