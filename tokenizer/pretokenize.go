package tokenizer

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers below implement the GPT-2 and GPT-4 splitting regexes
// by hand. Go's regexp has no lookahead, so `\s+(?!\S)` cannot be written in
// it, and a state machine that knows the pattern is several times faster
// than any regex engine. Each scanner reproduces the leftmost-first match
// sequence of the regex as Oniguruma (inside HF tokenizers) finds it; the
// golden ids in testdata pin that down.
//
// Character classes follow the regexes: \p{L} is unicode.IsLetter, \p{N} is
// unicode.IsNumber and \s is unicode.IsSpace (Unicode White_Space). A byte
// that is not valid UTF-8 is classed as "other" (neither letter, number nor
// space), one byte wide; HF never sees such bytes because its input is a
// Rust string.

type class uint8

const (
	clsOther class = iota
	clsLetter
	clsNumber
	clsSpace
)

var asciiClass [256]class // indexed by any byte: no bounds check; bytes from 0x80 up are never read

func init() {
	for c := 0; c < 128; c++ {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			asciiClass[c] = clsLetter
		case c >= '0' && c <= '9':
			asciiClass[c] = clsNumber
		case c == ' ', c >= '\t' && c <= '\r':
			asciiClass[c] = clsSpace
		default:
			asciiClass[c] = clsOther
		}
	}
}

// classAt returns the class and width of the character starting at b[i].
// Written to be inlined (cost 80, the compiler's budget): ASCII, nearly
// all of code, takes no call; the rest calls runeClass.
func classAt(b []byte, i int) (c class, w int) {
	c, w = asciiClass[b[i]], 1
	if b[i] >= utf8.RuneSelf {
		c, w = runeClass(b, i)
	}
	return
}

// runeClass is classAt for a character that is not ASCII.
func runeClass(b []byte, i int) (class, int) {
	r, w := utf8.DecodeRune(b[i:])
	if r == utf8.RuneError && w <= 1 {
		return clsOther, 1
	}
	switch {
	case unicode.IsLetter(r):
		return clsLetter, w
	case unicode.IsNumber(r):
		return clsNumber, w
	case unicode.IsSpace(r):
		return clsSpace, w
	}
	return clsOther, w
}

// scanClass returns the end of the run of characters of class cl from i.
// Letters and punctuation, the runs of nearly every word, have loops of
// their own with the lane test written out: the general loop switched on
// the class for every eight bytes, in a call.
func scanClass(b []byte, i int, cl class) int {
	switch cl {
	case clsLetter:
		return scanLetters(b, i)
	case clsOther:
		return scanOther(b, i)
	}
	for i < len(b) {
		// Eight ASCII bytes at a time while they are all of the class.
		for i+8 <= len(b) {
			stop := ^classLanes(binary.LittleEndian.Uint64(b[i:]), cl) & highBits
			if stop != 0 {
				i += bits.TrailingZeros64(stop) / 8
				break
			}
			i += 8
		}
		if i == len(b) {
			return i
		}
		if c := b[i]; c < utf8.RuneSelf {
			// ASCII, most of code and of English, without a call.
			if asciiClass[c] != cl {
				return i
			}
			i++
			continue
		}
		c, w := runeClass(b, i)
		if c != cl {
			return i
		}
		i += w
	}
	return i
}

// lettersEnd8 is scanLetters' first step, small enough to be inlined:
// where the first byte from j that is not an ASCII letter is within eight
// and is ASCII, the end of the run (most words); else ok is false and the
// run needs scanLetters.
func lettersEnd8(b []byte, j int) (end int, ok bool) {
	if j+8 > len(b) {
		return 0, false
	}
	x := binary.LittleEndian.Uint64(b[j:])
	v := x&^highBits | 0x20*lowBits
	// A lane stops the run when it is not an ASCII letter: not in 'a'-'z'
	// folded, or from 0x80 up.
	stop := (^((v + (0x80-'a')*lowBits) &^ (v + (0x7f-'z')*lowBits)) | x) & highBits
	// Only an ASCII byte ends the run here (the lowest stopping lane's own
	// top bit clear); a longer character may be a letter.
	return j + bits.TrailingZeros64(stop)/8, stop != 0 && stop&-stop&x == 0
}

// nonLetterLanes sets the top bit of each byte of x that is not an ASCII
// letter: not in 'a'-'z' folded, or from 0x80 up.
func nonLetterLanes(x uint64) uint64 {
	v := x&^highBits | 0x20*lowBits
	return (^((v + (0x80-'a')*lowBits) &^ (v + (0x7f-'z')*lowBits)) | x) & highBits
}

// scanLetters is scanClass for letters.
func scanLetters(b []byte, i int) int {
	for i < len(b) {
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			v := x&^highBits | 0x20*lowBits // 'A'-'Z' folded onto 'a'-'z'
			letters := (v + (0x80-'a')*lowBits) &^ (v + (0x7f-'z')*lowBits) &^ x
			if stop := ^letters & highBits; stop != 0 {
				i += bits.TrailingZeros64(stop) / 8
				break
			}
			i += 8
		}
		if i == len(b) {
			return i
		}
		if c := b[i]; c < utf8.RuneSelf {
			if asciiClass[c] != clsLetter {
				return i
			}
			i++
			continue
		}
		c, w := runeClass(b, i)
		if c != clsLetter {
			return i
		}
		i += w
	}
	return i
}

// scanOther is scanClass for what is neither letter, number nor space.
func scanOther(b []byte, i int) int {
	for i < len(b) {
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			x7 := x &^ highBits
			v := x7 | 0x20*lowBits
			notOther := (v+(0x80-'a')*lowBits)&^(v+(0x7f-'z')*lowBits) |
				(x7+(0x80-'0')*lowBits)&^(x7+(0x7f-'9')*lowBits) |
				(x7+(0x80-'\t')*lowBits)&^(x7+(0x7f-'\r')*lowBits) |
				(x7+(0x80-' ')*lowBits)&^(x7+(0x7f-' ')*lowBits)
			// A byte from 0x80 up stops the run too: it starts or
			// continues a longer character, classed below.
			if stop := (notOther | x) & highBits; stop != 0 {
				i += bits.TrailingZeros64(stop) / 8
				break
			}
			i += 8
		}
		if i == len(b) {
			return i
		}
		if c := b[i]; c < utf8.RuneSelf {
			if asciiClass[c] != clsOther {
				return i
			}
			i++
			continue
		}
		c, w := runeClass(b, i)
		if c != clsOther {
			return i
		}
		i += w
	}
	return i
}

// Byte lanes of a 64-bit word.
const (
	lowBits  = 0x0101_0101_0101_0101
	highBits = 0x8080_8080_8080_8080
)

// classLanes sets the top bit of each byte of x that is an ASCII character
// of class cl, eight at once: a byte is in [lo, hi] when, with its top bit
// cleared, adding 0x80-lo sets the top bit and adding 0x7f-hi does not
// (neither sum carries out of its byte); bytes from 0x80 up, the start or
// middle of a longer character, are never in a class here.
func classLanes(x uint64, cl class) uint64 {
	ascii := ^x & highBits
	x7 := x &^ highBits
	in := func(v uint64, lo, hi byte) uint64 {
		return (v + (0x80-uint64(lo))*lowBits) &^ (v + (0x7f-uint64(hi))*lowBits)
	}
	var m uint64
	switch cl {
	case clsLetter:
		m = in(x7|0x20*lowBits, 'a', 'z') // 'A'-'Z' or 'a'-'z'
	case clsNumber:
		m = in(x7, '0', '9')
	case clsSpace:
		m = in(x7, '\t', '\r') | in(x7, ' ', ' ')
	default:
		m = ^(in(x7|0x20*lowBits, 'a', 'z') | in(x7, '0', '9') | in(x7, '\t', '\r') | in(x7, ' ', ' '))
	}
	return m & ascii
}

// spaceRun ends a whitespace match that starts at i (b[i] is whitespace):
// `\s+(?!\S)|\s+`. Before a non-space character the greedy run gives back
// its last character, unless that would leave nothing.
func spaceRun(b []byte, i int) int {
	j, last := i, i
	for j < len(b) {
		c, w := classAt(b, j)
		if c != clsSpace {
			break
		}
		last = j
		j += w
	}
	if j == len(b) || last == i {
		return j
	}
	return last
}

// splitter cuts a piece of text into words: from offset i, a word's start,
// it appends each word's end offset to ends and returns it, stopping at the
// end of b or once ends holds maxEnds. Matching restarts at each word's
// end whatever came before, so the caller resumes from the last end; the
// few hundred offsets stay in the core's cache however long the text.
type splitter func(b []byte, i int, ends []int) []int

const maxEnds = 256

// splitGPT2 implements
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// word by word through gpt2Len, as splitWordsGPT2 does, and through the
// general scan (gpt2WordEnd) in the last 15 bytes.
func splitGPT2(b []byte, i int, ends []int) []int {
	for i < len(b) && len(ends) < maxEnds {
		if i+16 <= len(b) {
			i += gpt2Len(b, i)
		} else {
			i = gpt2WordEnd(b, i)
		}
		ends = append(ends, i)
	}
	return ends
}

// gpt2WordEnd returns the end of the GPT-2 pattern's word that starts at
// b[i], for any text: the general scan.
func gpt2WordEnd(b []byte, i int) int {
	if b[i] == '\'' {
		if n := contraction(b[i+1:], false); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(b, i)
	start := i
	if b[i] == ' ' && i+1 < len(b) {
		c2, _ := classAt(b, i+1)
		if c2 != clsSpace {
			c, start, w = c2, i+1, 0
		}
	}
	// The run goes on from start+w: after the first character, or
	// from the character after a leading space.
	switch c {
	case clsSpace:
		return spaceRun(b, i)
	case clsLetter:
		if e, ok := lettersEnd8(b, start+w); ok {
			return e
		}
		return scanLetters(b, start+w)
	}
	return scanClass(b, start+w, c)
}

// gpt2Len returns the length of the GPT-2 pattern's word at i, which has
// 16 bytes of b from it: a run of letters, with or without a space before
// it, by one lane test when its letters end within the 16; the other
// words of ASCII text that end within the 16 by gpt2ShortLen; the rest by
// the general scan. splitWordsGPT2 has a copy of the letters' branch.
func gpt2Len(b []byte, i int) int {
	w := (*[16]byte)(b[i : i+16])
	k0, k1 := gpt4Kind[w[0]], gpt4Kind[w[1]]
	if k0 == kLetter || k0 == kSpace && k1 == kLetter {
		x0 := binary.LittleEndian.Uint64(w[:8])
		// Past byte 0, the first letter or the space: byte 1 is then
		// a letter.
		if stop := nonLetterLanes(x0) &^ 0xff; stop != 0 {
			n := bits.TrailingZeros64(stop) / 8
			if stop&-stop&x0 != 0 { // a longer character: a letter?
				return scanLetters(b, i+n) - i
			}
			return n
		}
		x1 := binary.LittleEndian.Uint64(w[8:])
		if stop := nonLetterLanes(x1); stop != 0 && stop&-stop&x1 == 0 {
			return 8 + bits.TrailingZeros64(stop)/8
		}
		return scanLetters(b, i+8) - i
	}
	if n := gpt2ShortLen(w, k0, k1); n > 0 {
		return n
	}
	return gpt2WordEnd(b, i) - i
}

// gpt2ShortLen is the length of a GPT-2 word at w[0] that is not a run of
// letters (with or without a space before it), when it is ASCII and ends
// within w with an ASCII byte: found there with no call (its runs are
// short: "()", " {", "\n\t\t", " 0"); 0 for any other word. A byte from
// 0x80 up that could change the word (a number, a space, punctuation
// that is not ASCII) leaves it to the general scan.
func gpt2ShortLen(w *[16]byte, k0, k1 uint8) int {
	j, digits := 1, false
	switch k0 {
	case kQuote:
		switch w[1] { // case-sensitive, unlike GPT-4's
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v':
			if w[2] == 'e' {
				return 3
			}
		case 'l':
			if w[2] == 'l' {
				return 3
			}
		}
	case kOther:
	case kDigit:
		digits = true
	case kSpace:
		switch k1 {
		case kDigit:
			j, digits = 2, true
		case kOther, kQuote:
			j = 2
		case kSpace, kBlank, kBreak:
			j = 0
		default: // a longer character, or a letter (not reached)
			return 0
		}
	case kBlank, kBreak:
		j = 0
	default: // a longer character, or a letter (not reached)
		return 0
	}
	switch {
	case digits:
		// ` ?\p{N}+` from j.
		for ; j < 16; j++ {
			if k := gpt4Kind[w[j]]; k != kDigit {
				if k == kHigh {
					return 0
				}
				return j
			}
		}
		return 0 // it may go on
	case j > 0:
		// ` ?[^\s\p{L}\p{N}]+` from j.
		for ; j < 16; j++ {
			if k := gpt4Kind[w[j]]; k != kOther && k != kQuote {
				if k == kHigh {
					return 0
				}
				return j
			}
		}
		return 0
	}
	// Whitespace: `\s+(?!\S)|\s+`, w[0] whitespace. Before what is not
	// whitespace the run gives its last byte back, unless that leaves
	// nothing.
	for j = 1; j < 16; j++ {
		if k := gpt4Kind[w[j]]; k != kSpace && k != kBlank && k != kBreak {
			if k == kHigh {
				return 0
			}
			return max(j-1, 1)
		}
	}
	return 0 // it may go on, or reach the end of the text
}

// contraction returns the length of a contraction suffix at the start of b
// (after the apostrophe): s t m d re ve ll, case-insensitively when fold is
// set, or 0.
func contraction(b []byte, fold bool) int {
	if len(b) == 0 {
		return 0
	}
	lower := func(c byte) byte {
		if fold && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch lower(b[0]) {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if len(b) > 1 && lower(b[1]) == 'e' {
			return 2
		}
	case 'l':
		if len(b) > 1 && lower(b[1]) == 'l' {
			return 2
		}
	}
	if fold && len(b) >= 2 && b[0] == 0xC5 && b[1] == 0xBF {
		// U+017F LATIN SMALL LETTER LONG S folds to 's' under (?i).
		return 2
	}
	return 0
}

// splitGPT4 implements the GPT-4 (cl100k) and Llama-3 pattern
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// and splitQwen2 Qwen2's variant, with \p{N} in place of \p{N}{1,3}.
// They are functions, not a closure made for the digit count: Go 1.26
// compiles such a closure again inside each caller its maker is inlined
// into, and those copies (the one a load used among them) inlined none of
// its calls, classAt and lettersEnd8 included: two calls a word.
func splitGPT4(b []byte, i int, ends []int) []int { return splitGPT4Like(b, i, ends, 3) }

func splitQwen2(b []byte, i int, ends []int) []int { return splitGPT4Like(b, i, ends, 1) }

func splitGPT4Like(b []byte, i int, ends []int, maxDigits int) []int {
	if cap(ends)-len(ends) < maxEnds {
		ends = slices.Grow(ends, maxEnds)
	}
	// Stored by index into a slice whose length the loop tests: no call
	// to grow it in the loop, whose values then stay in registers.
	buf, n := ends[:cap(ends)], len(ends)
	for stop := min(len(buf), len(ends)+maxEnds); i < len(b) && n < stop; n++ {
		if i+16 <= len(b) {
			i += gpt4Len(b, i, maxDigits)
		} else {
			i = gpt4WordEnd(b, i, maxDigits)
		}
		buf[n] = i
	}
	return buf[:n]
}

// gpt4Len returns the length of the GPT-4 pattern's word at i, which has
// 16 bytes of b from it: the words of ASCII text from those 16 bytes
// alone, the rest from gpt4OtherEnd or gpt4WordEnd. The two commonest
// words, a run of letters and one with a one-character prefix (" the",
// ".x", "(err"), are told by the kinds of the first two bytes and ended
// by one lane test when their letters end within the 16. splitWordsGPT4
// has a copy of the letters' branch.
func gpt4Len(b []byte, i int, digits int) int {
	w := (*[16]byte)(b[i : i+16])
	k0, k1 := gpt4Kind[w[0]], gpt4Kind[w[1]]
	if k0 == kLetter || k1 == kLetter && k0 <= kBlank {
		x0 := binary.LittleEndian.Uint64(w[:8])
		// Past byte 0, the first letter or the prefix: byte 1 is
		// then a letter.
		if stop := nonLetterLanes(x0) &^ 0xff; stop != 0 {
			n := bits.TrailingZeros64(stop) / 8
			if stop&-stop&x0 != 0 { // a longer character: a letter?
				return scanLetters(b, i+n) - i
			}
			return n
		}
		x1 := binary.LittleEndian.Uint64(w[8:])
		if stop := nonLetterLanes(x1); stop != 0 && stop&-stop&x1 == 0 {
			return 8 + bits.TrailingZeros64(stop)/8
		}
		return scanLetters(b, i+8) - i
	}
	if n := gpt4ShortLen(w, k0, k1, digits); n > 0 {
		return n
	}
	return gpt4OtherEnd(b, i, k0, k1, digits) - i
}

// gpt4ShortLen is the length of a word at w[0] that is neither letters
// nor a prefix and letters, when it is ASCII and ends within w: found
// there with no call, byte by byte (its runs are short: "()", " {\n",
// "\n\t\t", "0"); 0 for any other word.
func gpt4ShortLen(w *[16]byte, k0, k1 uint8, digits int) int {
	if k1 == kHigh {
		return 0 // a longer character: a letter after a prefix?
	}
	j := 1
	switch k0 {
	case kDigit:
		// \p{N}{1,3}; an ASCII byte that stops the run short ends it,
		// a longer character may be a number.
		for ; j < digits && j < 16; j++ {
			if k := gpt4Kind[w[j]]; k != kDigit {
				if k == kHigh {
					return 0
				}
				break
			}
		}
		return j
	case kQuote:
		switch w[1] | 0x20 { // case-insensitive
		case 's', 't', 'm', 'd':
			return 2
		case 'r', 'v':
			if w[2]|0x20 == 'e' {
				return 3
			}
		case 'l':
			if w[2]|0x20 == 'l' {
				return 3
			}
		}
		if k1 == kLetter {
			return 0
		}
	case kSpace:
		if k1 == kOther || k1 == kQuote {
			j = 2
		} else {
			j = 0
		}
	case kBlank, kBreak:
		j = 0
	case kHigh:
		return 0
	}
	if j > 0 {
		// ` ?[^\s\p{L}\p{N}]+[\r\n]*` from j.
		for ; j < 16; j++ {
			if k := gpt4Kind[w[j]]; k != kOther && k != kQuote {
				if k == kHigh {
					return 0
				}
				break
			}
		}
		for ; j < 16 && gpt4Kind[w[j]] == kBreak; j++ {
		}
		if j == 16 {
			return 0 // it may go on
		}
		return j
	}
	// Whitespace: `\s*[\r\n]+|\s+(?!\S)|\s+`.
	nl := -1
	for ; j < 16; j++ {
		k := gpt4Kind[w[j]]
		if k == kBreak {
			nl = j
		} else if k != kSpace && k != kBlank {
			if k == kHigh {
				return 0
			}
			break
		}
	}
	switch {
	case j == 16:
		return 0 // it may go on, or reach the end of the text
	case nl >= 0:
		return nl + 1
	case j == 1:
		return 1
	}
	return j - 1
}

// Kinds of bytes for the GPT-4 and GPT-2 patterns' ASCII paths. The kinds
// that can prefix a run of letters under GPT-4's come first.
const (
	kOther  = iota // [^\s\p{L}\p{N}] but the apostrophe
	kSpace         // ' '
	kBlank         // \t \v \f: whitespace that is not ' ' nor a line break
	kLetter        // [A-Za-z]
	kDigit         // [0-9]
	kBreak         // \r \n
	kQuote         // ', which may start a contraction
	kHigh          // 0x80 and up: part of a longer character
)

var gpt4Kind [256]uint8

func init() {
	for c := range 256 {
		var k uint8
		switch {
		case c >= utf8.RuneSelf:
			k = kHigh
		case c == '\'':
			k = kQuote
		case c == '\r', c == '\n':
			k = kBreak
		case c == ' ':
			k = kSpace
		case asciiClass[c] == clsSpace:
			k = kBlank
		case asciiClass[c] == clsLetter:
			k = kLetter
		case asciiClass[c] == clsNumber:
			k = kDigit
		default:
			k = kOther
		}
		gpt4Kind[c] = k
	}
}

// gpt4OtherEnd ends, in b, the words that are not letters and that
// gpt4ShortLen leaves (runs past 16 bytes, a quote before letters): b[i]
// and b[i+1], of kinds k0 and k1, are not a letter nor a prefix and a
// letter, and 16 bytes from i are in b. Where a character that is not
// ASCII could change the word, gpt4WordEnd decides it.
func gpt4OtherEnd(b []byte, i int, k0, k1 uint8, maxDigits int) int {
	if k0 == kHigh || k1 == kHigh {
		return gpt4WordEnd(b, i, maxDigits)
	}
	switch k0 {
	case kDigit:
		// \p{N}{1,3}: an ASCII digit that stops the run short leaves
		// the rest to the general scan, in case it is a number.
		j := i + 1
		for ; j-i < maxDigits; j++ {
			if k := gpt4Kind[b[j]]; k != kDigit {
				if k == kHigh {
					return gpt4WordEnd(b, i, maxDigits)
				}
				break
			}
		}
		return j
	case kQuote:
		if c := contraction(b[i+1:], true); c > 0 {
			return i + 1 + c
		}
		if k1 == kLetter {
			return scanLetters(b, i+2)
		}
		return otherRunEnd(b, i+1)
	case kOther:
		return otherRunEnd(b, i+1)
	case kSpace:
		if k1 == kOther || k1 == kQuote {
			return otherRunEnd(b, i+2)
		}
	}
	// Whitespace: `\s*[\r\n]+|\s+(?!\S)|\s+`.
	j, nl := i, -1
	for ; j < len(b); j++ {
		k := gpt4Kind[b[j]]
		if k == kBreak {
			nl = j
		} else if k != kSpace && k != kBlank {
			if k == kHigh {
				return gpt4WordEnd(b, i, maxDigits)
			}
			break
		}
	}
	switch {
	case nl >= 0:
		return nl + 1
	case j == len(b) || j == i+1:
		return j
	}
	return j - 1
}

// otherRunEnd ends ` ?[^\s\p{L}\p{N}]+[\r\n]*` whose run of
// punctuation goes on from j.
func otherRunEnd(b []byte, j int) int {
	j = scanOther(b, j)
	for j < len(b) && (b[j] == '\r' || b[j] == '\n') {
		j++
	}
	return j
}

// gpt4WordEnd returns the end of the GPT-4 pattern's word that starts at
// b[i], for any text: the general scan.
func gpt4WordEnd(b []byte, i int, maxDigits int) int {
	if b[i] == '\'' {
		if n := contraction(b[i+1:], true); n > 0 {
			return i + 1 + n
		}
	}
	c, w := classAt(b, i)
	switch c {
	case clsLetter:
		return scanLetters(b, i+w)
	case clsNumber:
		j := i + w
		for k := 1; k < maxDigits && j < len(b); k++ {
			c2, w2 := classAt(b, j)
			if c2 != clsNumber {
				break
			}
			j += w2
		}
		return j
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+ with a one-character prefix.
	if b[i] != '\r' && b[i] != '\n' && i+w < len(b) {
		c2, w2 := classAt(b, i+w)
		if c2 == clsLetter {
			return scanLetters(b, i+w+w2)
		}
		// A space, then what is not a letter: c2 is the class of
		// the character after it, for the punctuation rule below.
		if b[i] == ' ' && c2 == clsOther {
			return otherRunEnd(b, i+1)
		}
	}
	// ` ?[^\s\p{L}\p{N}]+[\r\n]*` (with the space, above).
	if c == clsOther {
		return otherRunEnd(b, i)
	}
	// c is whitespace. `\s*[\r\n]+`: the run up to its last line break.
	j, nl := i, -1
	for j < len(b) {
		c2, w2 := classAt(b, j)
		if c2 != clsSpace {
			break
		}
		if b[j] == '\r' || b[j] == '\n' {
			nl = j
		}
		j += w2
	}
	if nl >= 0 {
		return nl + 1
	}
	return spaceRun(b, i)
}

// Known Split patterns, as HF tokenizer.json files spell them.
const (
	patternGPT2  = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	patternGPT4  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// gpt4DigitsOf is the most digits a word has under a GPT-4-like pattern
// (3 for GPT-4's, 1 for Qwen2's), or 0 for another pattern.
func gpt4DigitsOf(pattern string) int {
	switch pattern {
	case patternGPT4:
		return 3
	case patternQwen2:
		return 1
	}
	return 0
}

// splitterFor returns the scanner for a Split pattern, or nil when the
// pattern is not one kiln implements.
func splitterFor(pattern string) splitter {
	switch pattern {
	case patternGPT2:
		return splitGPT2
	case patternGPT4:
		return splitGPT4
	case patternQwen2:
		return splitQwen2
	}
	return nil
}
