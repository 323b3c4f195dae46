package tokenizer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// wordsOnEightWorkers has eight encoders, each made by worker, encode
// every word twice, each encoder in its own order, and returns a line for
// each encoder's first word whose ids are not want's. A word lies at the
// start of a longer buffer, as inside a document: its key is read 16 bytes
// at a time.
func wordsOnEightWorkers(worker func() *encoderState, words [][]byte, want [][]uint32) []string {
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := worker()
			order := rand.New(rand.NewPCG(uint64(g), 1)).Perm(len(words))
			for range 2 {
				for _, i := range order {
					buf := append(slices.Clone(words[i]), "zzzzzzzzzzzzzzzz"...)
					if got := st.word(nil, buf[:len(words[i])]); !slices.Equal(got, want[i]) {
						errs <- fmt.Sprintf("word %q: %v, want %v", words[i], got, want[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	var lines []string
	for e := range errs {
		lines = append(lines, e)
	}
	return lines
}

// Workers that share one word table get, for every word, the ids the
// merges give it on one goroutine with no cache: eight encoders fill and
// read one table at once, each meeting the same words in its own order and
// twice, while the table grows under them, and with a largest size small
// enough that it fills (then the words go to each encoder's own table).
// Run it with -race too: the table is written by some workers while the
// others read it or copy it.
func TestSharedWordTableGivesTheSingleThreadIDs(t *testing.T) {
	words := randomWords(rand.New(rand.NewPCG(21, 22)), 20_000, maxPacked)
	for _, style := range styles {
		tk := loadStyle(t, style)
		single := newEncoderState(tk)
		want := make([][]uint32, len(words))
		for i, w := range words {
			want[i] = single.merge(nil, w)
		}
		largest := sharedWordsMaxBits
		defer func() { sharedWordsMaxBits = largest }()
		for _, maxBits := range []int{14, largest} {
			sharedWordsMaxBits = maxBits
			var cur atomic.Pointer[sharedWords]
			cur.Store(newSharedWords(12, &cur))
			worker := func() *encoderState {
				st := newEncoderState(tk)
				st.words.share(cur.Load())
				return st
			}
			for _, e := range wordsOnEightWorkers(worker, words, want) {
				t.Errorf("%s, largest table 1<<%d slots: %s", style, maxBits, e)
			}
			// 20,000 words (of 100,000 ids) grow a table of 1<<12 slots
			// at least twice, or once and fill it.
			s := cur.Load()
			if maxBits == largest && len(s.slots) < 1<<16 {
				t.Errorf("the table holds %d slots after 20,000 words: it did not grow", len(s.slots))
			}
			full := s.n.Load() >= int64(len(s.slots)/2) || s.nids.Load() > int64(len(s.ids))
			if maxBits < largest && (len(s.slots) != 1<<maxBits || !full) {
				t.Errorf("the largest table holds %d words in %d slots: it never filled, the overflow went untested", s.n.Load(), len(s.slots))
			}
		}
	}
}

// EncodeBatch on more workers than documents' first words can keep apart
// gives each document the ids Encode gives it on a fresh tokenizer, whose
// one encoder never shares a table.
func TestEncodeBatchWithASharedTableMatchesOneEncoder(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	rng := rand.New(rand.NewPCG(31, 32))
	var docs []string
	for _, name := range texts {
		text := string(readTestdata(t, name+".txt"))
		for len(text) > 0 {
			n := min(len(text), 500+rng.IntN(4000))
			docs = append(docs, text[:n])
			text = text[n:]
		}
	}
	for i := range 200 {
		docs = append(docs, string(randomText(rng, 200+i)))
	}
	for _, style := range styles {
		batch, one := loadStyle(t, style), loadStyle(t, style)
		for round := range 2 {
			got := batch.EncodeBatch(docs)
			for i, d := range docs {
				if j := firstDiff(got[i], one.Encode(d)); j >= 0 {
					t.Fatalf("%s, round %d, document %d (%q...): ids differ at %d", style, round, i, d[:min(len(d), 40)], j)
				}
			}
		}
		if s := batch.shared.Load(); s == nil || s.n.Load() == 0 {
			t.Fatalf("%s: EncodeBatch on 8 workers left the shared table empty", style)
		}
	}
}

// A call that knows its text is large (a stream of a file, EncodeBatch)
// makes the shared word table at its largest, so that no growth sends words
// to one worker's own table while the workers are learning the text's
// words; a small or unknown text starts it small. The ids are those of one
// encoder either way.
func TestSharedTableStartsLargeForALargeText(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	large := sharedWordsLargeText
	defer func() { sharedWordsLargeText = large }()
	sharedWordsLargeText = 64 << 10
	text := append(readTestdata(t, "go.txt"), readTestdata(t, "english.txt")...)
	for len(text) < 3*int(sharedWordsLargeText) {
		text = append(text, text...)
	}
	small := text[:sharedWordsLargeText/4]
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		text []byte
		bits int
		call func(tk *Tokenizer, path string, text []byte) []uint32
	}{
		{"a stream of a large file", text, sharedWordsMaxBits, streamFile},
		{"a stream of a small file", small, sharedWordsMinBits, streamFile},
		{"a stream of unknown length", text, sharedWordsMinBits, func(tk *Tokenizer, _ string, text []byte) []uint32 {
			var ids []uint32
			if err := tk.EncodeReader(context.Background(), struct{ io.Reader }{bytes.NewReader(text)}, func(got []uint32) error {
				ids = append(ids, got...)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return ids
		}},
		{"a large batch", text, sharedWordsMaxBits, func(tk *Tokenizer, _ string, text []byte) []uint32 {
			var ids []uint32
			for _, d := range tk.EncodeBatch(docs8K(string(text))) {
				ids = append(ids, d...)
			}
			return ids
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, "text.txt")
			if err := os.WriteFile(path, c.text, 0o644); err != nil {
				t.Fatal(err)
			}
			tk := loadStyle(t, "gpt4-style")
			got := c.call(tk, path, c.text)
			s := tk.shared.Load()
			if s == nil {
				t.Fatal("no shared word table: the call ran on one worker")
			}
			if len(s.slots) != 1<<c.bits {
				t.Errorf("the shared word table has %d slots, want 1<<%d", len(s.slots), c.bits)
			}
			want := loadStyle(t, "gpt4-style").EncodeBytes(c.text)
			if c.name == "a large batch" {
				want = nil
				one := loadStyle(t, "gpt4-style")
				for _, d := range docs8K(string(c.text)) {
					want = append(want, one.Encode(d)...)
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%d ids, want %d (one encoder's)", len(got), len(want))
			}
		})
	}
}

// streamFile encodes the file at path through EncodeReaderTo, as `sched
// tokenize` does, and returns its ids.
func streamFile(tk *Tokenizer, path string, _ []byte) []uint32 {
	f, err := os.Open(path)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	var out bytes.Buffer
	if _, err := tk.EncodeReaderTo(context.Background(), f, &out, 4); err != nil {
		panic(err)
	}
	ids := make([]uint32, out.Len()/4)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint32(out.Bytes()[4*i:])
	}
	return ids
}

// A shared table of hugeTableMin bytes or more lives outside the Go heap
// on Linux (on huge pages where the system gives them): it holds words as
// one on the heap does, and its memory is unmapped once no worker holds
// the table, so that a long-lived process tokenizing many large files does
// not keep every table it ever made.
func TestLargeSharedTableIsUnmappedWhenDropped(t *testing.T) {
	if !mapsTables {
		t.Skip("tables are mapped outside the heap on Linux only, and not under the race detector")
	}
	tk := loadStyle(t, "gpt2-style")
	words := randomWords(rand.New(rand.NewPCG(5, 6)), 5_000, maxPacked)
	const bits = 18 // 6 MiB of slots
	if 24<<bits < hugeTableMin {
		t.Fatalf("a table of 1<<%d slots is below hugeTableMin; the test needs a larger one", bits)
	}
	base := func() uintptr {
		var cur atomic.Pointer[sharedWords]
		s := newSharedWords(bits, &cur)
		cur.Store(s)
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(s.slots)))
		if _, ok := mappedTables.Load(addr); !ok {
			t.Fatalf("a table of %d bytes is on the Go heap", 24<<bits)
		}
		if addr%hugePage != 0 {
			t.Fatalf("the table at %#x is not aligned to a huge page", addr)
		}
		st, one := newEncoderState(tk), newEncoderState(tk)
		st.words.share(s)
		for range 2 {
			for _, w := range words {
				buf := append(slices.Clone(w), "zzzzzzzzzzzzzzzz"...)
				if got, want := st.word(nil, buf[:len(w)]), one.merge(nil, w); !slices.Equal(got, want) {
					t.Fatalf("word %q: %v, want %v", w, got, want)
				}
			}
		}
		if s.n.Load() == 0 {
			t.Fatal("no word went to the mapped table")
		}
		return addr
	}()
	// The cleanup runs after a collection finds the table unreachable.
	for i := 0; ; i++ {
		if _, ok := mappedTables.Load(base); !ok {
			break
		}
		if i == 1000 {
			t.Fatal("the table is still mapped after 1000 collections")
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// EncodeBatch encodes each document straight into a block with room for an
// id a byte. NFC can lengthen a text (U+0958, three bytes, becomes
// U+0915 U+093C, six), and a vocabulary without merges for it then gives
// more ids than the document has bytes: the block moves, and every
// document, those before the move included, keeps the ids Encode gives.
func TestEncodeBatchKeepsTheIDsWhenNFCLengthensADocument(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	var cfg map[string]any
	if err := json.Unmarshal(readTestdata(t, "gpt2-style.tokenizer.json"), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["normalizer"] = map[string]any{"type": "NFC"}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("\u0958", 1000)
	if n := len(tk.Encode(long)); n <= len(long) {
		t.Fatalf("%d ids for %d bytes: the test needs a document with more ids than bytes", n, len(long))
	}
	text := string(readTestdata(t, "go.txt"))
	var docs []string
	for i := 0; len(text) > 0; i++ {
		n := min(len(text), 3000)
		docs = append(docs, text[:n])
		text = text[n:]
		if i%7 == 3 {
			docs = append(docs, long, "x"+long)
		}
	}
	// The second call sizes its blocks at the first's ids a byte.
	for round := range 2 {
		got := tk.EncodeBatch(docs)
		for i, d := range docs {
			if j := firstDiff(got[i], tk.Encode(d)); j >= 0 {
				t.Fatalf("round %d, document %d (%q...): ids differ at %d", round, i, d[:min(len(d), 20)], j)
			}
		}
	}
}

// Workers of one Tokenizer share the ids of words too long for a slot:
// eight encoders meet the same long words, each in its own order and
// twice, and get for every word the ids the merges give on one goroutine,
// with the table at its largest (then it holds every word) and with a
// largest size small enough that it fills and starts over many times. A
// worker takes a long word's ids from the shared table rather than merging
// it again: ids planted there come back.
func TestSharedLongWordsGiveTheSingleThreadIDs(t *testing.T) {
	var words [][]byte
	for _, w := range randomWords(rand.New(rand.NewPCG(41, 42)), 6_000, 300) {
		if len(w) > maxPacked {
			words = append(words, w)
		}
	}
	largest := longWordsMaxBits
	defer func() { longWordsMaxBits = largest }()
	for _, style := range styles {
		single := newEncoderState(loadStyle(t, style))
		want := make([][]uint32, len(words))
		for i, w := range words {
			want[i] = single.merge(nil, w)
		}
		for _, maxBits := range []int{longWordsMinBits, largest} {
			longWordsMaxBits = maxBits
			tk := loadStyle(t, style)
			worker := func() *encoderState { return tk.workerState(8, 0) }
			for _, e := range wordsOnEightWorkers(worker, words, want) {
				t.Errorf("%s, largest table 1<<%d slots: %s", style, maxBits, e)
			}
			l := tk.long.cur.Load()
			if l == nil {
				t.Fatalf("%s: eight workers left no shared table of long words", style)
			}
			held := 0
			for i, w := range words {
				if ids, ok := l.get(w); ok {
					held++
					if !slices.Equal(ids, want[i]) {
						t.Errorf("%s: the shared table holds %v for %q, want %v", style, ids, w, want[i])
					}
				}
			}
			switch {
			case maxBits == largest && held != len(words):
				t.Errorf("%s: the shared table holds %d of the %d words eight workers met twice", style, held, len(words))
			case maxBits < largest && (l.bits != maxBits || held == len(words)):
				t.Errorf("%s: a table of at most 1<<%d slots is of 1<<%d and holds %d words of %d: it never filled, starting over went untested", style, maxBits, l.bits, held, len(words))
			}
		}

		tk := loadStyle(t, style)
		w := []byte("a_word_longer_than_a_slot_holds")
		tk.long.put(w, []uint32{7, 7, 7})
		if ids, ok := tk.long.get(w); !ok || !slices.Equal(ids, []uint32{7, 7, 7}) {
			t.Fatalf("%s: an empty table refused a word (%v, %v)", style, ids, ok)
		}
		if got := tk.workerState(2, 0).word(nil, w); !slices.Equal(got, []uint32{7, 7, 7}) {
			t.Errorf("%s: a worker gave %v for a word whose ids the shared table holds as [7 7 7]: it merged the word again", style, got)
		}
		if got, want := newEncoderState(tk).word(nil, w), single.merge(nil, w); !slices.Equal(got, want) {
			t.Errorf("%s: an encoder of its own gave %v, want the merges' %v", style, got, want)
		}
	}
}

// EncodeBatch sizes a worker's blocks of ids for its share of the text at
// the ids a byte of the call before: on eight workers the second call over
// 1 MB allocates little more than its ids, not a block of batchBlock ids
// for each worker (32 MiB). The ids are Encode's.
func TestEncodeBatchBlocksFitTheShare(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	var docs []string
	for _, name := range texts {
		text := string(readTestdata(t, name+".txt"))
		for len(text) > 0 {
			n := min(len(text), 3000)
			docs = append(docs, text[:n])
			text = text[n:]
		}
	}
	for _, style := range styles {
		tk := loadStyle(t, style)
		tk.EncodeBatch(docs)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got := tk.EncodeBatch(docs)
		runtime.ReadMemStats(&after)
		var ids int
		for i, d := range docs {
			if j := firstDiff(got[i], tk.Encode(d)); j >= 0 {
				t.Fatalf("%s: document %d: ids differ at %d", style, i, j)
			}
			ids += len(got[i])
		}
		// A worker's first block has an eighth more than its share, a
		// second a quarter of that: at most 1.41 times the ids' bytes.
		alloc, most := after.TotalAlloc-before.TotalAlloc, uint64(2*4*ids+24*len(docs)+1<<20)
		if alloc > most {
			t.Errorf("%s: the second EncodeBatch of %d ids allocated %d bytes, want at most %d", style, ids, alloc, most)
		}
	}
}

// Eight goroutines that take documents from a queue and encode each with
// AppendEncodedAmong get Encode's ids from a fresh tokenizer, and their
// words go into the table they share.
func TestAppendEncodedAmongMatchesOneEncoder(t *testing.T) {
	var docs []string
	for _, name := range texts {
		text := string(readTestdata(t, name+".txt"))
		for len(text) > 0 {
			n := min(len(text), 2000)
			docs = append(docs, text[:n])
			text = text[n:]
		}
	}
	for _, style := range styles {
		pool, one := loadStyle(t, style), loadStyle(t, style)
		got := make([][]uint32, len(docs))
		work := make(chan int)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					got[i] = pool.AppendEncodedAmong(8, []uint32{1 << 30}, []byte(docs[i]))
				}
			}()
		}
		for round := range 2 {
			for i := range docs {
				work <- i
			}
			if round == 0 {
				continue
			}
			close(work)
			wg.Wait()
		}
		for i, d := range docs {
			if got[i][0] != 1<<30 {
				t.Fatalf("%s: document %d: the ids were not appended to dst", style, i)
			}
			if j := firstDiff(got[i][1:], one.Encode(d)); j >= 0 {
				t.Fatalf("%s: document %d (%q...): ids differ at %d", style, i, d[:min(len(d), 30)], j)
			}
		}
		if s := pool.shared.Load(); s == nil || s.n.Load() == 0 {
			t.Fatalf("%s: eight encoders left the shared table empty", style)
		}
	}
}
