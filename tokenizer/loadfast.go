package tokenizer

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// The vocabulary and the merges are nearly all of a tokenizer.json (1.7 MB
// for 30,000 tokens), and encoding/json spent more time on them, value by
// value through reflection, than `sched tokenize` then spends encoding 5 MB
// of text. fastModel reads those two values by hand and leaves the rest of
// the file, a few kilobytes, to encoding/json. It accepts only the plain
// form HF writes (string keys, integer ids, merges as "a b" or ["a", "b"]);
// on anything else it reports false and Parse reads the whole file with
// encoding/json, whose errors name the problem.

// fastModel returns data with the model's vocab and merges replaced by
// empty ones, those two values parsed, and data as a string, which they
// are cut from: data itself when owned says nothing else holds or changes
// it, else a copy. ok is false when the file is not in the plain form.
func fastModel(data []byte, owned bool) (rest []byte, text string, vocab map[string]uint32, merges [][2]string, ok bool) {
	// JSON's structure is ASCII, so when the file is valid UTF-8 every
	// string in it is: one check, not one per string, made beside the
	// scan, which does not depend on it.
	valid := make(chan bool, 1)
	go func() { valid <- utf8.Valid(data) }()
	// The file as one string: the keys and tokens below are pieces of it,
	// not an allocation each (90,000 of them for 30,000 tokens). A copy
	// unless data is the caller's to give (Load's own read): 1.7 MB
	// copied into fresh pages took 4-5 ms of the 54 that `sched tokenize`
	// of a few bytes took on a 2-vCPU VM.
	if owned && len(data) > 0 {
		text = unsafe.String(unsafe.SliceData(data), len(data))
	} else {
		text = string(data)
	}
	s := &jsonScan{b: data, s: text}
	// The merges are a third of the scan and can be read beside the
	// vocabulary: from where their array seems to start, taken only if the
	// scan in order arrives there.
	ahead := make(chan mergesAhead, 1)
	at := mergesArray(data)
	if at > 0 {
		go func() {
			m := &jsonScan{b: data, s: text, i: at}
			merges, ok := parseMerges(m)
			ahead <- mergesAhead{merges, ok, m.i}
		}()
	}
	var vocabAt, mergesAt [2]int
	modelSeen := false
	ok = s.object(func(key string) bool {
		if !strings.EqualFold(key, "model") {
			return s.skip()
		}
		if key != "model" || modelSeen {
			return false
		}
		modelSeen = true
		return s.object(func(key string) bool {
			var where *[2]int
			switch {
			case key == "vocab":
				where = &vocabAt
			case key == "merges":
				where = &mergesAt
			case strings.EqualFold(key, "vocab"), strings.EqualFold(key, "merges"):
				return false
			default:
				return s.skip()
			}
			if where[1] != 0 {
				return false // the key twice
			}
			s.space()
			where[0] = s.i
			var ok bool
			switch {
			case where == &vocabAt:
				vocab, ok = parseVocab(s)
			case s.i == at:
				a := <-ahead
				at = -1 // taken
				merges, ok, s.i = a.merges, a.ok, a.end
			default:
				merges, ok = parseMerges(s)
			}
			where[1] = s.i
			return ok
		})
	})
	s.space()
	if at > 0 {
		<-ahead // not taken: wait for it to end, and drop it
	}
	if !<-valid || !ok || s.i != len(data) || vocabAt[1] == 0 || mergesAt[1] == 0 {
		return nil, "", nil, nil, false
	}
	first, second := vocabAt, mergesAt
	firstVal, secondVal := "{}", "[]"
	if second[0] < first[0] {
		first, second = second, first
		firstVal, secondVal = secondVal, firstVal
	}
	rest = make([]byte, 0, len(data)-(first[1]-first[0])-(second[1]-second[0])+4)
	rest = append(rest, data[:first[0]]...)
	rest = append(rest, firstVal...)
	rest = append(rest, data[first[1]:second[0]]...)
	rest = append(rest, secondVal...)
	rest = append(rest, data[second[1]:]...)
	return rest, text, vocab, merges, true
}

// mergesAhead is the merges read beside the vocabulary, and where they end.
type mergesAhead struct {
	merges [][2]string
	ok     bool
	end    int
}

// mergesArray returns where the array of the key "merges" seems to start
// in data, or -1: the first `"merges"` followed by a colon and a bracket.
// Only a key can be followed by a colon, and a string's own quotes are
// escaped, so it is the model's merges unless another object has a key of
// that name before them; the scan in order decides.
func mergesArray(data []byte) int {
	key := []byte(`"merges"`)
	for i := 0; ; {
		k := bytes.Index(data[i:], key)
		if k < 0 {
			return -1
		}
		s := &jsonScan{b: data, i: i + k + len(key)}
		if s.eat(':') {
			s.space()
			if s.i < len(data) && data[s.i] == '[' {
				return s.i
			}
		}
		i += k + len(key)
	}
}

// parseVocab reads the object at s.i.
func parseVocab(s *jsonScan) (map[string]uint32, bool) {
	// Sized for every colon after it: the vocabulary's entries and a few
	// more (counting one byte is far cheaper than counting `":`).
	vocab := make(map[string]uint32, bytes.Count(s.b[s.i:], []byte{':'})+1)
	ok := s.object(func(key string) bool {
		if _, dup := vocab[key]; dup {
			return false // encoding/json keeps the last; leave it to it
		}
		s.space()
		id, ok := s.uint31()
		vocab[key] = id
		return ok
	})
	return vocab, ok
}

// parseMerges reads the array at s.i.
func parseMerges(s *jsonScan) ([][2]string, bool) {
	merges := make([][2]string, 0, bytes.Count(s.b[s.i:], []byte{','})/2+1)
	ok := s.array(func() bool {
		s.space()
		if s.i < len(s.b) && s.b[s.i] == '[' {
			var pair [2]string
			n := 0
			ok := s.array(func() bool {
				s.space()
				str, ok := s.str()
				if n < 2 {
					pair[n] = str
				}
				n++
				return ok
			})
			if !ok || n != 2 {
				return false
			}
			merges = append(merges, pair)
			return true
		}
		str, ok := s.str()
		if !ok {
			return false
		}
		a, c, found := strings.Cut(str, " ")
		if !found || a == "" || c == "" || strings.Contains(c, " ") {
			return false // the slow path names the bad merge
		}
		merges = append(merges, [2]string{a, c})
		return true
	})
	return merges, ok
}

// jsonScan walks JSON text, valid UTF-8, without building values. s holds
// the same bytes as b, for strings to be cut from without a copy.
type jsonScan struct {
	b []byte
	s string
	i int
}

func (s *jsonScan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *jsonScan) eat(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// object reads {"key": value, ...}; member is called after each key's
// colon and must read the value.
func (s *jsonScan) object(member func(key string) bool) bool {
	if !s.eat('{') {
		return false
	}
	if s.eat('}') {
		return true
	}
	for {
		s.space()
		key, ok := s.str()
		if !ok || !s.eat(':') || !member(key) {
			return false
		}
		if s.eat('}') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// array reads [value, ...]; elem must read each value.
func (s *jsonScan) array(elem func() bool) bool {
	if !s.eat('[') {
		return false
	}
	if s.eat(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.eat(']') {
			return true
		}
		if !s.eat(',') {
			return false
		}
	}
}

// str reads a string. One with escapes is decoded by encoding/json; one with
// a control character is refused (encoding/json would refuse it).
func (s *jsonScan) str() (string, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return "", false
	}
	start := s.i + 1
	escaped := false
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			if escaped {
				var out string
				if json.Unmarshal(s.b[start-1:j+1], &out) != nil {
					return "", false
				}
				return out, true
			}
			return s.s[start:j], true
		case c == '\\':
			escaped = true
			j++
		case c < 0x20:
			return "", false
		}
	}
	return "", false
}

// uint31 reads a non-negative integer below 2^31 written plainly.
func (s *jsonScan) uint31() (uint32, bool) {
	start := s.i
	var n uint64
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		n = 10*n + uint64(s.b[s.i]-'0')
		if n >= 1<<31 {
			return 0, false
		}
		s.i++
	}
	digits := s.i - start
	if digits == 0 || (digits > 1 && s.b[start] == '0') {
		return 0, false
	}
	return uint32(n), true
}

// skip reads any one value.
func (s *jsonScan) skip() bool {
	s.space()
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '{':
		return s.object(func(string) bool { return s.skip() })
	case '[':
		return s.array(s.skip)
	case '"':
		_, ok := s.str()
		return ok
	}
	// A number, true, false or null: encoding/json checks it in the rest.
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			break
		}
		s.i++
	}
	return s.i > start
}
