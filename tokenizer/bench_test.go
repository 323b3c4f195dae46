package tokenizer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// benchText is the text of KILN_TOKENIZER_BENCH_TEXT when set (to compare
// with HF tokenizers' hf_tokenizers_bench.js on the same file), else the
// golden texts.
func benchText(b *testing.B) []byte {
	if p := os.Getenv("KILN_TOKENIZER_BENCH_TEXT"); p != "" {
		data, err := os.ReadFile(p)
		if err != nil {
			b.Fatal(err)
		}
		return data
	}
	var all []byte
	for _, name := range texts {
		all = append(all, readTestdata(b, name+".txt")...)
	}
	return all
}

// docs8K cuts text as the HF benchmark does: about 8 KB, ending at a line.
func docs8K(text string) []string {
	var docs []string
	for i := 0; i < len(text); {
		j := min(len(text), i+8192)
		if nl := strings.IndexByte(text[j:], '\n'); nl >= 0 {
			j += nl + 1
		} else {
			j = len(text)
		}
		docs = append(docs, text[i:j])
		i = j
	}
	return docs
}

// BenchmarkEncodeBatch is throughput on all cores (GOMAXPROCS), the figure
// compared with HF's encodeBatch; run with -cpu 1 for per-core throughput.
// It is the warm throughput, as the peers' figures are (the best of three
// passes after one that fills their caches): an untimed call first fills
// the word tables.
func BenchmarkEncodeBatch(b *testing.B) {
	text := benchText(b)
	docs := docs8K(string(text))
	for _, style := range styles {
		b.Run(style, func(b *testing.B) {
			tk := loadStyle(b, style)
			b.SetBytes(int64(len(text)))
			tk.EncodeBatch(docs)
			b.ResetTimer()
			cpu := processCPU()
			for b.Loop() {
				tk.EncodeBatch(docs)
			}
			reportCPUPerGB(b, cpu, int64(len(text)))
		})
	}
}

// BenchmarkLongWord encodes text without whitespace, one word; time per
// byte must stay flat as the size grows (no quadratic merge).
func BenchmarkLongWord(b *testing.B) {
	tk := loadStyle(b, "gpt2-style")
	for _, n := range []int{1 << 18, 1 << 20, 4 << 20} {
		w := bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz"), n/26+1)[:n]
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				tk.EncodeBytes(w)
			}
		})
	}
}

// BenchmarkLongWordMemory encodes one word of 4 MiB (a run of spaces, as
// a document of whitespace is one `\s+` word under either pattern, and
// letters with no whitespace) and reports, per byte of the word, the bytes
// allocated and the most the heap held above where it started (sampled
// every 100µs, garbage not yet collected included: what the process's
// resident memory follows).
func BenchmarkLongWordMemory(b *testing.B) {
	const n = 4 << 20
	words := []struct {
		name string
		w    []byte
	}{
		{"spaces", bytes.Repeat([]byte{' '}, n)},
		{"letters", bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz"), n/26+1)[:n]},
	}
	for _, style := range styles {
		tk := loadStyle(b, style)
		for _, w := range words {
			b.Run(style+"/"+w.name, func(b *testing.B) {
				b.SetBytes(n)
				b.ReportAllocs()
				var peak uint64
				for b.Loop() {
					peak = max(peak, heapPeak(func() { tk.EncodeBytes(w.w) }))
				}
				b.ReportMetric(float64(peak)/n, "peak-B/byte")
			})
		}
	}
}

// heapPeak runs f and returns the most the heap's objects, live or not
// yet swept, came to above where they were after a collection before it.
func heapPeak(f func()) uint64 {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() uint64 {
		metrics.Read(sample)
		return sample[0].Value.Uint64()
	}
	runtime.GC()
	base := read()
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	go func() {
		defer wg.Done()
		for {
			if v := read(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	f()
	close(done)
	wg.Wait()
	if p := max(peak.Load(), read()); p > base {
		return p - base
	}
	return 0
}

// BenchmarkTrain trains a 16384 vocabulary on KILN_TOKENIZER_TRAIN_TEXT (or
// the golden texts, with a 4096 vocabulary).
func BenchmarkTrain(b *testing.B) {
	vocab := 16384
	var text []byte
	if p := os.Getenv("KILN_TOKENIZER_TRAIN_TEXT"); p != "" {
		var err error
		if text, err = os.ReadFile(p); err != nil {
			b.Fatal(err)
		}
	} else {
		text, vocab = benchText(b), 4096
	}
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := Train(context.Background(), []io.Reader{bytes.NewReader(text)}, TrainOptions{VocabSize: vocab}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodePool is the pattern of ingest's encoder pool:
// GOMAXPROCS goroutines take documents of about 8 KB from a channel and
// encode each, with word tables of their own (own: AppendEncoded) or the
// ones a Tokenizer's workers share (among: AppendEncodedAmong; bounded:
// AppendEncodedAmongBounded at DefaultMaxWordBytes, as ingest calls it).
// Each pass is on a freshly parsed tokenizer, as ingest meets text it has
// not seen; the parse is outside the clock.
func BenchmarkEncodePool(b *testing.B) {
	text := benchText(b)
	docs := docs8K(string(text))
	for _, style := range styles {
		raw := readTestdata(b, style+".tokenizer.json")
		for _, mode := range []string{"own", "among", "bounded"} {
			b.Run(style+"/"+mode, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				n := runtime.GOMAXPROCS(0)
				var cpu time.Duration
				for b.Loop() {
					b.StopTimer()
					tk, err := Parse(raw)
					if err != nil {
						b.Fatal(err)
					}
					work := make(chan string, 4*n)
					var wg sync.WaitGroup
					c0 := processCPU()
					b.StartTimer()
					for range n {
						wg.Add(1)
						go func() {
							defer wg.Done()
							var ids []uint32
							for d := range work {
								p := unsafe.Slice(unsafe.StringData(d), len(d))
								switch mode {
								case "own":
									ids = tk.AppendEncoded(ids[:0], p)
								case "among":
									ids = tk.AppendEncodedAmong(n, ids[:0], p)
								default:
									var err error
									if ids, err = tk.AppendEncodedAmongBounded(n, ids[:0], p, DefaultMaxWordBytes); err != nil {
										panic(err)
									}
								}
							}
						}()
					}
					for _, d := range docs {
						work <- d
					}
					close(work)
					wg.Wait()
					cpu += processCPU() - c0
				}
				if cpu > 0 { // processCPU reads the process's CPU time on Linux only
					b.ReportMetric(cpu.Seconds()/(float64(b.N)*float64(len(text))/1e9), "cpu-s/GB")
				}
			})
		}
	}
}

// BenchmarkEncodeReaderCold is the path of `sched tokenize` without the
// process: a freshly parsed tokenizer (cold word caches) streams the text
// through EncodeReader; the parse is counted, as it is in the command.
func BenchmarkEncodeReaderCold(b *testing.B) {
	text := benchText(b)
	for _, style := range styles {
		raw := readTestdata(b, style+".tokenizer.json")
		b.Run(style, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			cpu := processCPU()
			for b.Loop() {
				tk, err := Parse(raw)
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				err = tk.EncodeReader(context.Background(), bytes.NewReader(text), func(ids []uint32) error {
					n += len(ids)
					return nil
				})
				if err != nil || n == 0 {
					b.Fatal(err, n)
				}
			}
			reportCPUPerGB(b, cpu, int64(len(text)))
		})
	}
}

// streamClock splits passes of EncodeReaderTo into the workers' encoding
// and the rest, from streamEvent: the share of the workers' time spent
// encoding, the ramp (from the call until every worker has begun a piece)
// and the tail (from the first worker finding no piece left until the call
// returns). On many cores these are what a speed-up short of the core count
// is made of, beside work that got slower.
type streamClock struct {
	mu         sync.Mutex
	workers    int
	t0         time.Time
	began      map[int]time.Time // each worker's piece in hand
	seen       map[int]bool
	lastFirst  time.Time // the last worker's first piece
	firstIdle  time.Time
	busy       time.Duration
	wall, ramp time.Duration // over the passes
	tail       time.Duration
	encoding   time.Duration
	passes     int
	parse      time.Duration
}

func (c *streamClock) event(w, seq int, done bool) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case seq < 0:
		if c.firstIdle.IsZero() {
			c.firstIdle = now
		}
	case done:
		c.busy += now.Sub(c.began[w])
	default:
		c.began[w] = now
		if !c.seen[w] {
			c.seen[w] = true
			c.lastFirst = now
		}
	}
}

// pass times one call of encode, with streamEvent set.
func (c *streamClock) pass(encode func()) {
	c.mu.Lock()
	c.workers = runtime.GOMAXPROCS(0)
	c.t0, c.began, c.seen = time.Now(), map[int]time.Time{}, map[int]bool{}
	c.lastFirst, c.firstIdle, c.busy = time.Time{}, time.Time{}, 0
	c.mu.Unlock()
	streamEvent = c.event
	encode()
	streamEvent = nil
	end := time.Now()
	c.wall += end.Sub(c.t0)
	c.ramp += c.lastFirst.Sub(c.t0)
	c.tail += end.Sub(c.firstIdle)
	c.encoding += c.busy
	c.passes++
}

func (c *streamClock) report(b *testing.B) {
	if c.passes == 0 {
		return
	}
	n := float64(c.passes)
	b.ReportMetric(100*c.encoding.Seconds()/(c.wall.Seconds()*float64(c.workers)), "encoding-%")
	b.ReportMetric(c.ramp.Seconds()*1e3/n, "ramp-ms")
	b.ReportMetric(c.tail.Seconds()*1e3/n, "tail-ms")
	if c.parse > 0 {
		b.ReportMetric(c.parse.Seconds()*1e3/n, "parse-ms")
	}
}

// BenchmarkTokenizeFile is `sched tokenize` on one file without the
// process: the file (KILN_TOKENIZER_BENCH_TEXT, else the golden texts)
// read through EncodeReaderTo as 2-byte ids into io.Discard. cold parses
// the tokenizer in each iteration, as the command does, so that every
// worker starts with empty word caches; warm reuses one whose workers'
// caches an untimed pass over the whole file has filled. Their ratio on
// many cores is what the workers' separate caches cost. The chunk variants
// change the piece size, cold. Each reports streamClock's split of the
// time, and cold the parse's time.
func BenchmarkTokenizeFile(b *testing.B) {
	path := os.Getenv("KILN_TOKENIZER_BENCH_TEXT")
	if path == "" {
		path = filepath.Join(b.TempDir(), "text")
		if err := os.WriteFile(path, benchText(b), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	pass := func(b *testing.B, tk *Tokenizer, clock *streamClock) {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		clock.pass(func() {
			if n, err := tk.EncodeReaderTo(context.Background(), f, io.Discard, 2); err != nil || n == 0 {
				b.Fatal(err, n)
			}
		})
	}
	for _, style := range styles {
		raw := readTestdata(b, style+".tokenizer.json")
		parse := func(b *testing.B) *Tokenizer {
			tk, err := Parse(raw)
			if err != nil {
				b.Fatal(err)
			}
			return tk
		}
		cold := func(chunk int) func(b *testing.B) {
			return func(b *testing.B) {
				defer func(c int) { streamChunk = c }(streamChunk)
				streamChunk = chunk
				b.SetBytes(st.Size())
				var clock streamClock
				cpu := processCPU()
				for b.Loop() {
					t0 := time.Now()
					tk := parse(b)
					clock.parse += time.Since(t0)
					pass(b, tk, &clock)
				}
				reportCPUPerGB(b, cpu, st.Size())
				clock.report(b)
			}
		}
		b.Run(style+"/cold", cold(streamChunk))
		b.Run(style+"/warm", func(b *testing.B) {
			tk := parse(b)
			pass(b, tk, &streamClock{})
			b.SetBytes(st.Size())
			var clock streamClock
			cpu := processCPU()
			for b.Loop() {
				pass(b, tk, &clock)
			}
			reportCPUPerGB(b, cpu, st.Size())
			clock.report(b)
		})
		for _, chunk := range []int{256 << 10, 4 << 20} {
			b.Run(fmt.Sprintf("%s/chunk%dKiB", style, chunk>>10), cold(chunk))
		}
	}
}

// BenchmarkParse is the load of `sched tokenize`, which every process pays
// before it encodes anything, on one core while the others wait.
func BenchmarkParse(b *testing.B) {
	for _, style := range styles {
		raw := readTestdata(b, style+".tokenizer.json")
		b.Run(style, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if _, err := Parse(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
