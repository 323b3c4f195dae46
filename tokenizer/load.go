package tokenizer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// FormatError says what in a tokenizer.json kiln cannot use. It is the
// caller's to fix, so it reports itself as bad input.
type FormatError struct {
	Path string // file, or "" when parsed from bytes
	Msg  string
	Err  error // the cause, when there is one (a file that cannot be read)
}

func (e *FormatError) Unwrap() error { return e.Err }

func (e *FormatError) Error() string {
	if e.Path == "" {
		return "tokenizer.json: " + e.Msg
	}
	return e.Path + ": " + e.Msg
}

// BadInput marks the error as the caller's to fix (sched exits 2).
func (e *FormatError) BadInput() bool { return true }

func formatErr(format string, args ...any) error {
	return &FormatError{Msg: fmt.Sprintf(format, args...)}
}

// fastLoad lets tests compare fastModel with encoding/json alone.
var fastLoad = true

type fileJSON struct {
	Version       string          `json:"version"`
	Truncation    json.RawMessage `json:"truncation"`
	Padding       json.RawMessage `json:"padding"`
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         *modelJSON      `json:"model"`
}

type addedJSON struct {
	ID         *uint32 `json:"id"`
	Content    string  `json:"content"`
	SingleWord bool    `json:"single_word"`
	LStrip     bool    `json:"lstrip"`
	RStrip     bool    `json:"rstrip"`
	Normalized bool    `json:"normalized"`
	Special    bool    `json:"special"`
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`

	pairs [][2]string // the merges, when fastModel read them
}

type componentJSON struct {
	Type           string            `json:"type"`
	AddPrefixSpace bool              `json:"add_prefix_space"`
	UseRegex       *bool             `json:"use_regex"`
	Pattern        map[string]string `json:"pattern"`
	Behavior       string            `json:"behavior"`
	Invert         bool              `json:"invert"`
	PreTokenizers  []json.RawMessage `json:"pretokenizers"`
	Normalizers    []json.RawMessage `json:"normalizers"`
	Processors     []json.RawMessage `json:"processors"`
	Decoders       []json.RawMessage `json:"decoders"`
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// maxFileSize is the largest tokenizer.json Load reads (a variable only so
// that tests can reach it cheaply). The largest published ones
// (vocabularies of 262,144 tokens with their merges) are tens of
// megabytes, so a file past 256 MiB is not a tokenizer.json but a wrong
// path: a device such as /dev/zero, or a pipe that never ends, which would
// otherwise be read until memory runs out. Parsing holds several times the
// file, so the cap also bounds what a load can cost.
var maxFileSize int64 = 256 << 20

// Load reads and parses a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	// data is this call's own: the parsed tokenizer's strings can be
	// pieces of it, not of a copy.
	t, err := parse(data, true)
	if err != nil {
		var fe *FormatError
		if errors.As(err, &fe) {
			fe.Path = path
		}
		return nil, err
	}
	return t, nil
}

// ReadFile reads the tokenizer.json at path whole, refusing one larger
// than the most a tokenizer.json may be. The read stops one byte past the
// cap, whatever the file is, so that a device or a pipe that never ends is
// refused, not read forever.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, cannotRead(path, err)
	}
	defer f.Close()
	size := int64(0) // what to make room for: a regular file's size
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		if st.Size() > maxFileSize {
			return nil, tooLarge(path) // refused without reading it
		}
		size = st.Size()
	}
	return readCapped(f, path, size)
}

// ReadAll reads a tokenizer.json from r, named name in errors (an object's
// key), with ReadFile's cap.
func ReadAll(r io.Reader, name string) ([]byte, error) { return readCapped(r, name, 0) }

func readCapped(r io.Reader, name string, size int64) ([]byte, error) {
	// Room for the whole file and bytes.MinRead more, so that a file of
	// the size Stat gave is read into one allocation, as os.ReadFile would.
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead))
	if _, err := buf.ReadFrom(io.LimitReader(r, maxFileSize+1)); err != nil {
		return nil, cannotRead(name, err)
	}
	if int64(buf.Len()) > maxFileSize {
		return nil, tooLarge(name)
	}
	return buf.Bytes(), nil
}

func tooLarge(name string) error {
	return &FormatError{Path: name, Msg: fmt.Sprintf("is larger than %d MiB, the most a tokenizer.json may be (real ones are tens of megabytes); give the path of a tokenizer.json", maxFileSize>>20)}
}

// cannotRead is the error of a path that does not lead to a readable file,
// which is the caller's to fix.
func cannotRead(path string, err error) error {
	why := err
	var pe *fs.PathError
	if errors.As(err, &pe) {
		why = pe.Err // the path is named once, first
	}
	return &FormatError{Path: path, Msg: fmt.Sprintf("cannot read the tokenizer: %v; give the path of a tokenizer.json", why), Err: err}
}

// Parse builds a Tokenizer from the contents of a tokenizer.json. Components
// kiln does not implement are refused with an error that names them, rather
// than approximated.
func Parse(data []byte) (*Tokenizer, error) { return parse(data, false) }

// parse is Parse; owned says that nothing else holds or changes data.
func parse(data []byte, owned bool) (*Tokenizer, error) {
	var f fileJSON
	rest, text, vocab, pairs, fast := fastModel(data, owned)
	fast = fast && fastLoad
	if !fast || json.Unmarshal(rest, &f) != nil {
		f, fast = fileJSON{}, false
		if err := json.Unmarshal(data, &f); err != nil {
			return nil, formatErr("not valid tokenizer JSON (%v); pass a tokenizer.json as written by HF tokenizers", err)
		}
	}
	if fast && f.Model != nil {
		f.Model.Vocab, f.Model.Merges, f.Model.pairs = vocab, nil, pairs
	}
	if !isNull(f.Truncation) {
		return nil, formatErr("truncation is set; kiln encodes whole documents, so remove it (set it to null)")
	}
	if !isNull(f.Padding) {
		return nil, formatErr("padding is set; kiln encodes whole documents, so remove it (set it to null)")
	}
	if f.Model == nil {
		return nil, formatErr("no model; kiln needs a BPE model")
	}
	if f.Model.Type != "BPE" {
		return nil, formatErr("model %q is not supported (kiln supports BPE)", f.Model.Type)
	}
	t := &Tokenizer{}
	if fast {
		// The digest waits for the first SHA256 call: encoding never
		// needs it, and hashing 2 MB was a quarter of loading. It hashes
		// the fast path's own copy of the file, which the caller cannot
		// change.
		t.sha256 = sync.OnceValue(func() string {
			sum := sha256.Sum256([]byte(text))
			return hex.EncodeToString(sum[:])
		})
	} else {
		sum := sha256.Sum256(data)
		hexSum := hex.EncodeToString(sum[:])
		t.sha256 = func() string { return hexSum }
	}
	var err error
	if t.nfc, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err = t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err = parseDecoder(f.Decoder); err != nil {
		return nil, err
	}
	if err = parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	if err = t.parseModel(f.Model); err != nil {
		return nil, err
	}
	if err = t.parseAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	t.init()
	return t, nil
}

func parseComponent(raw json.RawMessage, what string) (componentJSON, error) {
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return c, formatErr("%s is malformed: %v", what, err)
	}
	return c, nil
}

func parseNormalizer(raw json.RawMessage) (nfc bool, err error) {
	if isNull(raw) {
		return false, nil
	}
	c, err := parseComponent(raw, "normalizer")
	if err != nil {
		return false, err
	}
	switch c.Type {
	case "NFC":
		return true, nil
	case "Sequence":
		for _, n := range c.Normalizers {
			one, err := parseNormalizer(n)
			if err != nil {
				return false, err
			}
			nfc = nfc || one
		}
		return nfc, nil
	}
	return false, formatErr("normalizer %q is not supported (kiln supports none or NFC)", c.Type)
}

func parseDecoder(raw json.RawMessage) error {
	if isNull(raw) {
		return formatErr("no decoder; kiln needs the ByteLevel decoder")
	}
	c, err := parseComponent(raw, "decoder")
	if err != nil {
		return err
	}
	if c.Type == "ByteLevel" {
		return nil
	}
	if c.Type == "Sequence" && len(c.Decoders) == 1 {
		return parseDecoder(c.Decoders[0])
	}
	return formatErr("decoder %q is not supported (kiln supports ByteLevel)", c.Type)
}

func parsePostProcessor(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	c, err := parseComponent(raw, "post_processor")
	if err != nil {
		return err
	}
	// ByteLevel's post-processor only trims offsets; ids are unchanged.
	if c.Type == "ByteLevel" {
		return nil
	}
	return formatErr("post_processor %q is not supported (kiln supports none or ByteLevel)", c.Type)
}

// parsePreTokenizer flattens the pre-tokenizer into stages. Exactly one
// ByteLevel stage is required, last, since the BPE vocabulary is written in
// its alphabet.
func (t *Tokenizer) parsePreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return formatErr("no pre_tokenizer; kiln needs a ByteLevel pre-tokenizer")
	}
	var walk func(raw json.RawMessage) error
	walk = func(raw json.RawMessage) error {
		c, err := parseComponent(raw, "pre_tokenizer")
		if err != nil {
			return err
		}
		switch c.Type {
		case "Sequence":
			for _, p := range c.PreTokenizers {
				if err := walk(p); err != nil {
					return err
				}
			}
			return nil
		case "ByteLevel":
			st := stage{prefixSpace: c.AddPrefixSpace, byteLevel: true}
			if c.UseRegex == nil || *c.UseRegex {
				st.split, st.gpt2 = splitGPT2, true
			}
			t.stages = append(t.stages, st)
			return nil
		case "Split":
			re, ok := c.Pattern["Regex"]
			if !ok {
				return formatErr("pre_tokenizer Split with pattern %v is not supported (kiln supports the GPT-2, GPT-4/Llama-3 and Qwen2 Regex patterns)", c.Pattern)
			}
			sp := splitterFor(re)
			if sp == nil {
				return formatErr("pre_tokenizer Split regex %q is not supported (kiln supports the GPT-2, GPT-4/Llama-3 and Qwen2 patterns)", re)
			}
			if c.Behavior != "Isolated" || c.Invert {
				return formatErr("pre_tokenizer Split behavior %q (invert %v) is not supported (kiln supports Isolated, not inverted)", c.Behavior, c.Invert)
			}
			t.stages = append(t.stages, stage{split: sp, gpt4Digits: gpt4DigitsOf(re), gpt2: re == patternGPT2})
			return nil
		}
		return formatErr("pre_tokenizer %q is not supported (kiln supports ByteLevel, Split and Sequence)", c.Type)
	}
	if err := walk(raw); err != nil {
		return err
	}
	n := 0
	for _, s := range t.stages {
		if s.byteLevel {
			n++
		}
	}
	if n != 1 || !t.stages[len(t.stages)-1].byteLevel {
		return formatErr("pre_tokenizer must end with exactly one ByteLevel (found %d)", n)
	}
	return nil
}

func (t *Tokenizer) parseModel(m *modelJSON) error {
	if m.Type != "BPE" && m.Type != "" {
		return formatErr("model %q is not supported (kiln supports BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return formatErr("model.dropout %v is not supported (set it to null)", *m.Dropout)
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return formatErr("model.continuing_subword_prefix %q is not supported (set it to null)", *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return formatErr("model.end_of_word_suffix %q is not supported (set it to null)", *m.EndOfWordSuffix)
	}
	if m.ByteFallback {
		return formatErr("model.byte_fallback is not supported (set it to false)")
	}
	if len(m.Vocab) == 0 {
		return formatErr("model.vocab is empty")
	}
	t.ignoreMerges = m.IgnoreMerges
	t.vocab = m.Vocab
	maxID := uint32(0)
	// One bit an id, set by the token that has it: two tokens with one id
	// would make that id decode to either, and the ids encoded with the
	// other token would not round trip. The set starts at the size of a
	// dense vocabulary (ids 0 to len-1, as every real one is).
	taken := make([]uint64, (len(m.Vocab)+63)/64)
	shared := false
	for _, id := range m.Vocab {
		maxID = max(maxID, id)
		if id >= 1<<31 {
			continue // refused below
		}
		w, bit := int(id/64), uint64(1)<<(id%64)
		if w >= len(taken) {
			taken = append(taken, make([]uint64, w+1-len(taken))...)
		}
		shared = shared || taken[w]&bit != 0
		taken[w] |= bit
	}
	if maxID >= 1<<31 {
		return formatErr("model.vocab has id %d; ids must be below 2^31", maxID)
	}
	if shared {
		return sharedIDError(m.Vocab)
	}
	t.vocabIDs = taken
	t.vocabSize = int(maxID) + 1
	// The byte symbols: the tokens of one byte, each one character of
	// the byte-level alphabet.
	for c := range t.byteID {
		t.byteID[c] = noID
		if id, ok := m.Vocab[string(byteToRune[c])]; ok {
			t.byteID[c] = id
		}
	}
	t.unk = noID
	if m.UnkToken != nil {
		id, ok := m.Vocab[*m.UnkToken]
		if !ok {
			return formatErr("model.unk_token %q is not in the vocabulary", *m.UnkToken)
		}
		t.unk, t.fuseUnk = id, m.FuseUnk
	}
	n := len(m.pairs)
	if m.pairs == nil {
		n = len(m.Merges)
	}
	// The merges' tokens are looked up on several cores (a third of a
	// load on one), into their ids in rank order, then put in the table.
	type merge struct{ a, b, id uint32 }
	ids := make([]merge, n)
	errs := make([]error, (n+mergeBlock-1)/mergeBlock)
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for blk := range errs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			var ab []byte
			for rank := blk * mergeBlock; rank < min(n, (blk+1)*mergeBlock); rank++ {
				var a, b string
				if m.pairs != nil {
					a, b = m.pairs[rank][0], m.pairs[rank][1]
				} else {
					var err error
					if a, b, err = parseMerge(m.Merges[rank]); err != nil {
						errs[blk] = formatErr("model.merges[%d]: %v", rank, err)
						return
					}
				}
				ia, ok := m.Vocab[a]
				if !ok {
					errs[blk] = formatErr("model.merges[%d] names token %q, which is not in the vocabulary", rank, a)
					return
				}
				ib, ok := m.Vocab[b]
				if !ok {
					errs[blk] = formatErr("model.merges[%d] names token %q, which is not in the vocabulary", rank, b)
					return
				}
				ab = append(append(ab[:0], a...), b...)
				id, ok := m.Vocab[string(ab)]
				if !ok {
					errs[blk] = formatErr("model.merges[%d] makes %q, which is not in the vocabulary", rank, ab)
					return
				}
				ids[rank] = merge{ia, ib, id}
			}
		}()
	}
	if m.IgnoreMerges {
		// Encoding looks whole words up by their bytes.
		t.byBytes = make(map[string]uint32, len(m.Vocab))
		for tok, id := range m.Vocab {
			if b, ok := byteLevelDecode(tok); ok {
				t.byBytes[string(b)] = id
			}
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err // the first bad merge's
		}
	}
	t.merges = newMergeTable(n)
	for rank, mg := range ids {
		t.merges.put(mg.a, mg.b, uint32(rank), mg.id)
	}
	return nil
}

// sharedIDError names the smallest id of vocab that two tokens share, and
// the first two of its tokens in sorted order, so that the same file gives
// the same message on every load.
func sharedIDError(vocab map[string]uint32) error {
	byID := make(map[uint32][]string, len(vocab))
	for tok, id := range vocab {
		byID[id] = append(byID[id], tok)
	}
	id, toks := uint32(0), []string(nil)
	for i, ts := range byID {
		if len(ts) > 1 && (toks == nil || i < id) {
			id, toks = i, ts
		}
	}
	sort.Strings(toks)
	return formatErr("model.vocab gives id %d to two tokens, %q and %q: each id must name one token, or decoding it is ambiguous; give one of them another id (or remove it)", id, toks[0], toks[1])
}

// mergeBlock is how many merges one goroutine of a load looks up.
const mergeBlock = 4096

// decodeTables builds what Decode and Token read, on their first call:
// encoding never needs them, and decoding every token of the vocabulary
// was a fifth of a load.
func (t *Tokenizer) decodeTables() {
	t.decodeOnce.Do(func() {
		tokens := make([][]byte, t.vocabSize)
		tokenStr := make([]string, t.vocabSize)
		size := 0
		for tok := range t.vocab {
			size += len(tok)
		}
		// The tokens' bytes share one allocation (a token's bytes are
		// never longer than its string). Each id has one token
		// (parseModel refuses a shared one), so the map's order does
		// not matter.
		arena := make([]byte, 0, size)
		for tok, id := range t.vocab {
			n := len(arena)
			arena, _ = byteLevelDecodeAppend(arena, tok)
			tokens[id], tokenStr[id] = arena[n:len(arena):len(arena)], tok
		}
		// HF decodes an added token from its content, through the
		// ByteLevel decoder like any other token.
		for _, a := range t.added {
			b, _ := byteLevelDecode(a.content)
			tokens[a.id], tokenStr[a.id] = b, a.content
		}
		t.tokens, t.tokenStr = tokens, tokenStr
	})
}

// parseMerge accepts both spellings HF writes: "a b" and ["a", "b"].
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok || a == "" || b == "" || strings.Contains(b, " ") {
			return "", "", fmt.Errorf("%q is not two tokens separated by one space", s)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s is neither \"a b\" nor [\"a\", \"b\"]", raw)
	}
	return pair[0], pair[1], nil
}

func (t *Tokenizer) parseAdded(added []addedJSON) error {
	// An added token is often one of the vocabulary's, at its id
	// (<|endoftext|>); one of other content at an id the vocabulary gives
	// a token would make that id decode as the added token, and text
	// encoded to it would not round trip, as model.vocab's shared ids
	// would not (sharedIDError).
	owner := func(id uint32) (string, bool) {
		w := int(id / 64)
		if w >= len(t.vocabIDs) || t.vocabIDs[w]&(1<<(id%64)) == 0 {
			return "", false
		}
		for tok, v := range t.vocab { // only on the way to an error
			if v == id {
				return tok, true
			}
		}
		return "", false
	}
	defer func() { t.vocabIDs = nil }()
	addedAt := map[uint32]int{}
	for i, a := range added {
		if a.ID == nil {
			return formatErr("added_tokens[%d] (%q) has no id", i, a.Content)
		}
		if a.Content == "" {
			return formatErr("added_tokens[%d] has empty content", i)
		}
		if a.SingleWord {
			return formatErr("added_tokens[%d] (%q): single_word is not supported (set it to false)", i, a.Content)
		}
		id := *a.ID
		if id >= 1<<31 {
			return formatErr("added_tokens[%d] (%q) has id %d; ids must be below 2^31", i, a.Content, id)
		}
		if vid, ok := t.vocab[a.Content]; !ok || vid != id { // not the vocabulary's own token, repeated
			if tok, taken := owner(id); taken {
				return formatErr("added_tokens[%d] (%q) has id %d, which model.vocab gives to %q: each id must name one token, or decoding it is ambiguous; give the added token an id no other token has", i, a.Content, id, tok)
			}
		}
		if j, ok := addedAt[id]; ok && added[j].Content != a.Content {
			return formatErr("added_tokens[%d] (%q) has id %d, as added_tokens[%d] (%q) has: each id must name one token, or decoding it is ambiguous; give one of them another id", i, a.Content, id, j, added[j].Content)
		}
		addedAt[id] = i
		t.vocabSize = max(t.vocabSize, int(id)+1)
		t.added = append(t.added, addedToken{
			id: id, content: a.Content, lstrip: a.LStrip, rstrip: a.RStrip,
			normalized: a.Normalized, special: a.Special,
		})
	}
	return nil
}
