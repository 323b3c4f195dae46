package tokenizer

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"sync"

	"go.uber.org/zap"
)

// TrainOptions configures Train. The zero value is resolved to defaults by
// withDefaults.
type TrainOptions struct {
	// VocabSize is the size of the vocabulary to learn, counting special
	// tokens and the 256 byte symbols. Default 16384.
	VocabSize int
	// MinFrequency stops training when the most frequent pair occurs fewer
	// times. Default 2.
	MinFrequency int64
	// SpecialTokens get the first ids, in order, and are never split or
	// learned from. Default ["<|endoftext|>"], which EOS then finds.
	SpecialTokens []string
	// Pattern is the pre-tokenizer written to tokenizer.json: "gpt4" (the
	// GPT-4/Llama-3 Split regex, then ByteLevel; the default) or "gpt2".
	Pattern string
	// Progress, when set, is called as input is counted (stage "count",
	// bytes) and as merges are learned (stage "merge", merges).
	Progress func(stage string, done, total int64)
	// Logger receives a summary of each phase. Default zap.NewNop().
	Logger *zap.Logger
}

func (o TrainOptions) withDefaults() TrainOptions {
	if o.VocabSize == 0 {
		o.VocabSize = 16384
	}
	if o.MinFrequency == 0 {
		o.MinFrequency = 2
	}
	if o.SpecialTokens == nil {
		o.SpecialTokens = []string{"<|endoftext|>"}
	}
	if o.Pattern == "" {
		o.Pattern = "gpt4"
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// trainError is a bad option; it reports itself as bad input.
type trainError struct{ msg string }

func (e trainError) Error() string  { return e.msg }
func (e trainError) BadInput() bool { return true }

func (o TrainOptions) validate() error {
	min := len(o.SpecialTokens) + 256
	if o.VocabSize < min {
		return trainError{fmt.Sprintf("train: vocabulary size %d is below %d (256 byte symbols + %d special tokens); pass a larger size", o.VocabSize, min, len(o.SpecialTokens))}
	}
	if o.VocabSize > 1<<31 {
		return trainError{fmt.Sprintf("train: vocabulary size %d is too large: give at most %d (code models use 16384 to 131072)", o.VocabSize, 1<<31)}
	}
	if o.MinFrequency < 1 {
		return trainError{fmt.Sprintf("train: minimum frequency %d must be at least 1", o.MinFrequency)}
	}
	if o.Pattern != "gpt4" && o.Pattern != "gpt2" {
		return trainError{fmt.Sprintf("train: pattern %q is not one of gpt4, gpt2", o.Pattern)}
	}
	seen := map[string]bool{}
	for _, s := range o.SpecialTokens {
		if s == "" || seen[s] {
			return trainError{fmt.Sprintf("train: special token %q is empty or repeated", s)}
		}
		seen[s] = true
	}
	return nil
}

// countFlush is the number of distinct words a counting worker holds before
// it folds them into the shared table, bounding per-worker memory.
const countFlush = 1 << 18

// Train learns a byte-level BPE vocabulary from the texts read from inputs
// and returns it as a tokenizer.json that both kiln and HF tokenizers load.
// Input is streamed: it is read in chunks cut at line breaks, pre-tokenized
// and counted on all cores, so memory grows with the number of distinct
// words, not with the input.
func Train(ctx context.Context, inputs []io.Reader, opts TrainOptions) ([]byte, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	split := splitGPT2
	if opts.Pattern == "gpt4" {
		split = splitGPT4
	}
	var specials []addedToken
	for i, s := range opts.SpecialTokens {
		specials = append(specials, addedToken{id: uint32(i), content: s, special: true})
	}
	counts, total, err := countWords(ctx, inputs, split, newAddedSet(specials), opts.Progress)
	if err != nil {
		return nil, err
	}
	opts.Logger.Info("tokenizer train: counted words", zap.Int64("bytes", total), zap.Int("distinct_words", len(counts)))
	tokens, merges, err := learnMerges(ctx, counts, opts)
	if err != nil {
		return nil, err
	}
	opts.Logger.Info("tokenizer train: learned merges", zap.Int("merges", len(merges)), zap.Int("vocab", len(tokens)))
	if msg := Shortfall(len(tokens), opts.VocabSize, opts.MinFrequency); msg != "" {
		opts.Logger.Warn("tokenizer train: " + msg)
	}
	return writeTokenizerJSON(tokens, merges, opts)
}

// NoMerge says why a training learned no merge at all, and what to do:
// no pair of symbols occurs minFrequency times in the corpus, and no
// size asked for makes a tokenizer of the byte symbols alone of use.
func NoMerge(minFrequency int64) string {
	if minFrequency <= 0 {
		minFrequency = 2
	}
	return fmt.Sprintf("the corpus has no pair of symbols seen %s, so it teaches no merge (its tokenizer would hold the 256 byte symbols and the special tokens alone, one byte a token): train on more text", timesOrMore(minFrequency))
}

// minTrainedVocab is the fewest ids of a tokenizer with one merge: the 256
// byte symbols, an end-of-text token and the merge; no kiln command takes
// a smaller size.
const minTrainedVocab = 258

// Shortfall says, when a training yielded fewer ids than asked, why and
// what to do; "" when it yielded them all. BPE stops when no pair of
// symbols occurs minFrequency times: the corpus has no more to teach. The
// size it suggests is one a command takes: a yield below minTrainedVocab,
// which learned no merge, gets none.
func Shortfall(got, asked int, minFrequency int64) string {
	if got >= asked {
		return ""
	}
	if minFrequency <= 0 {
		minFrequency = 2
	}
	msg := fmt.Sprintf("the corpus yields %d ids of the %d asked: no pair of symbols occurs %s", got, asked, timesOrMore(minFrequency))
	if got < minTrainedVocab {
		return msg + ", so it taught no merge; train on more text"
	}
	return msg + fmt.Sprintf("; train on more text, or ask for %d ids", got)
}

// timesOrMore is "twice or more", "5 times or more": how often a pair
// must occur to be merged, in words.
func timesOrMore(n int64) string {
	switch n {
	case 1:
		return "once or more"
	case 2:
		return "twice or more"
	}
	return fmt.Sprintf("%d times or more", n)
}

// countWords pre-tokenizes all input on all cores and counts each word.
func countWords(ctx context.Context, inputs []io.Reader, split splitter, specials *addedSet, progress func(string, int64, int64)) (map[string]int64, int64, error) {
	workers := runtime.GOMAXPROCS(0)
	chunks := make(chan []byte, workers)
	global := map[string]int64{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A word's count lives in a slice the map indexes: looking a
			// word up by its bytes allocates nothing, where m[string(b)]++
			// allocated the key's string for every word of the input.
			local := map[string]int32{}
			var counts []int64
			fold := func() {
				mu.Lock()
				for w, i := range local {
					global[w] += counts[i]
				}
				mu.Unlock()
				clear(local)
				counts = counts[:0]
			}
			var ends []int
			countSeg := func(dst []uint32, seg []byte) []uint32 {
				for start := 0; start < len(seg); {
					ends = split(seg, start, ends[:0])
					for _, e := range ends {
						if i, ok := local[string(seg[start:e])]; ok {
							counts[i]++
						} else {
							local[string(seg[start:e])] = int32(len(counts))
							counts = append(counts, 1)
						}
						start = e
					}
				}
				return dst
			}
			for c := range chunks {
				specials.split(c, nil, countSeg)
				if len(local) > countFlush {
					fold()
				}
			}
			fold()
		}()
	}
	var total int64
	err := func() error {
		defer close(chunks)
		buf := make([]byte, streamChunk)
		for i, r := range inputs {
			var pending []byte
			for eof := false; !eof; {
				n, err := r.Read(buf)
				pending = append(pending, buf[:n]...)
				total += int64(n)
				if errors.Is(err, io.EOF) {
					eof = true
				} else if err != nil {
					return fmt.Errorf("train: read input %d: %w", i+1, err)
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				if len(pending) < streamChunk && !eof {
					continue
				}
				// Cut at the last line break: word counts near a cut may
				// differ from a whole-text count by one, which does not
				// change what is learned in any way that matters.
				p := bytes.LastIndexByte(pending, '\n') + 1
				if eof || p == 0 {
					p = len(pending)
				}
				select {
				case chunks <- pending[:p:p]:
				case <-ctx.Done():
					return ctx.Err()
				}
				pending = append([]byte(nil), pending[p:]...)
				if progress != nil {
					progress("count", total, -1)
				}
			}
		}
		return nil
	}()
	wg.Wait()
	if err != nil {
		return nil, 0, err
	}
	return global, total, nil
}

func mkPair(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

type pairEntry struct {
	count int64
	pair  uint64
}

// pairHeap is a max-heap by count; ties go to the smaller pair so that the
// result does not depend on map order.
type pairHeap []pairEntry

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(i, j int) bool {
	if h[i].count != h[j].count {
		return h[i].count > h[j].count
	}
	return h[i].pair < h[j].pair
}
func (h pairHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(pairEntry)) }
func (h *pairHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// learnMerges runs BPE training: repeatedly merge the most frequent adjacent
// pair, updating pair counts only around the merged positions.
func learnMerges(ctx context.Context, counts map[string]int64, opts TrainOptions) (tokens [][]byte, merges [][2]int32, err error) {
	nSpecial := len(opts.SpecialTokens)
	for _, s := range opts.SpecialTokens {
		tokens = append(tokens, []byte(s))
	}
	for b := 0; b < 256; b++ {
		tokens = append(tokens, []byte{byte(b)})
	}
	// Special tokens are in the table too, so that a learned token spelled
	// like one gets its id instead of a duplicate vocabulary key.
	byString := map[string]int32{}
	for i := 0; i < len(tokens); i++ {
		byString[string(tokens[i])] = int32(i)
	}

	keys := make([]string, 0, len(counts))
	for w := range counts {
		keys = append(keys, w)
	}
	sort.Strings(keys)
	words := make([][]int32, len(keys))
	freq := make([]int64, len(keys))
	pairCount := map[uint64]int64{}
	where := map[uint64][]int32{}
	for wi, w := range keys {
		syms := make([]int32, len(w))
		for i := 0; i < len(w); i++ {
			syms[i] = int32(nSpecial) + int32(w[i])
		}
		words[wi], freq[wi] = syms, counts[w]
		for i := 0; i+1 < len(syms); i++ {
			p := mkPair(syms[i], syms[i+1])
			pairCount[p] += freq[wi]
			where[p] = append(where[p], int32(wi))
		}
	}
	clear(counts)
	h := make(pairHeap, 0, len(pairCount))
	for p, c := range pairCount {
		h = append(h, pairEntry{c, p})
	}
	heap.Init(&h)

	stamp := make([]int32, len(words))
	var newSyms []int32
	var mergedOld, isNew []bool
	touched := map[uint64]bool{}
	want := opts.VocabSize
	for len(tokens) < want && h.Len() > 0 {
		if len(merges)%256 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, nil, err
			}
			if opts.Progress != nil {
				opts.Progress("merge", int64(len(tokens)), int64(want))
			}
		}
		top := heap.Pop(&h).(pairEntry)
		cur := pairCount[top.pair]
		if cur != top.count {
			if cur > 0 {
				heap.Push(&h, pairEntry{cur, top.pair})
			}
			continue
		}
		if cur < opts.MinFrequency {
			break
		}
		a, b := int32(top.pair>>32), int32(uint32(top.pair))
		s := string(tokens[a]) + string(tokens[b])
		x, ok := byString[s]
		if !ok {
			x = int32(len(tokens))
			tokens = append(tokens, []byte(s))
			byString[s] = x
		}
		merges = append(merges, [2]int32{a, b})
		step := int32(len(merges))
		clear(touched)
		for _, wi := range where[top.pair] {
			if stamp[wi] == step {
				continue
			}
			stamp[wi] = step
			old := words[wi]
			newSyms, mergedOld, isNew = newSyms[:0], mergedOld[:0], isNew[:0]
			for i := 0; i < len(old); i++ {
				if i+1 < len(old) && old[i] == a && old[i+1] == b {
					newSyms = append(newSyms, x)
					isNew = append(isNew, true)
					mergedOld = append(mergedOld, true, true)
					i++
					continue
				}
				newSyms = append(newSyms, old[i])
				isNew = append(isNew, false)
				mergedOld = append(mergedOld, false)
			}
			if len(newSyms) == len(old) {
				continue // a stale entry: the pair is gone from this word
			}
			f := freq[wi]
			for i := 0; i+1 < len(old); i++ {
				if mergedOld[i] || mergedOld[i+1] {
					p := mkPair(old[i], old[i+1])
					pairCount[p] -= f
				}
			}
			for i := 0; i+1 < len(newSyms); i++ {
				if isNew[i] || isNew[i+1] {
					p := mkPair(newSyms[i], newSyms[i+1])
					pairCount[p] += f
					where[p] = append(where[p], wi)
					touched[p] = true
				}
			}
			words[wi] = append(old[:0], newSyms...)
		}
		delete(where, top.pair)
		delete(pairCount, top.pair)
		for p := range touched {
			if c := pairCount[p]; c > 0 {
				heap.Push(&h, pairEntry{c, p})
			}
		}
	}
	if opts.Progress != nil {
		opts.Progress("merge", int64(len(tokens)), int64(want))
	}
	return tokens, merges, nil
}

// writeTokenizerJSON writes the vocabulary in HF's tokenizer.json format,
// vocabulary in id order and merges as pairs.
func writeTokenizerJSON(tokens [][]byte, merges [][2]int32, opts TrainOptions) ([]byte, error) {
	nSpecial := len(opts.SpecialTokens)
	str := func(id int32) string {
		if int(id) < nSpecial {
			return opts.SpecialTokens[id]
		}
		return byteLevelEncode(tokens[id])
	}
	var b bytes.Buffer
	enc := func(v any) {
		j, _ := json.Marshal(v)
		b.Write(j)
	}
	b.WriteString("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [")
	for i, s := range opts.SpecialTokens {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n    ")
		enc(map[string]any{"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	b.WriteString("\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": ")
	if opts.Pattern == "gpt4" {
		b.WriteString(`{"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": `)
		enc(patternGPT4)
		b.WriteString(`}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}`)
	} else {
		b.WriteString(`{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}`)
	}
	b.WriteString(",\n  \"post_processor\": null,\n  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true},\n")
	b.WriteString("  \"model\": {\n    \"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n    \"vocab\": {")
	for id := range tokens {
		if id > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n      ")
		enc(str(int32(id)))
		fmt.Fprintf(&b, ": %d", id)
	}
	b.WriteString("\n    },\n    \"merges\": [")
	for i, m := range merges {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n      ")
		enc([2]string{str(m[0]), str(m[1])})
	}
	b.WriteString("\n    ]\n  }\n}\n")
	return b.Bytes(), nil
}
