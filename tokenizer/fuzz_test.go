package tokenizer

import (
	"strings"
	"testing"
)

func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{"", "hello world", "it's  \t\n\r\n x", "\xff\xfe", "日本語 123456", "'S'll ſ", strings.Repeat("ab", 300)} {
		f.Add([]byte(s))
	}
	tks := []*Tokenizer{loadStyle(f, "gpt2-style"), loadStyle(f, "gpt4-style")}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, tk := range tks {
			out, err := tk.Decode(tk.EncodeBytes(b))
			if err != nil {
				t.Fatal(err)
			}
			if out != string(b) {
				t.Fatalf("%q round trips to %q", b, out)
			}
		}
	})
}

// Parse must return an error, never panic, on any input.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","zz"]]},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"},"added_tokens":[{"id":5,"content":"<s>"}]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tk, err := Parse(b)
		if err == nil {
			ids := tk.Encode("hello <s> world 12")
			if _, err := tk.Decode(ids); err != nil {
				t.Fatalf("decode of own ids: %v", err)
			}
		}
	})
}

func TestParseErrorsNameTheProblem(t *testing.T) {
	ok := `"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"ByteLevel"}`
	cases := map[string]string{
		`{`: "not valid tokenizer JSON",
		`{"model":{"type":"Unigram"},` + ok + `}`:                                                                       `model "Unigram"`,
		`{"model":{"type":"BPE","vocab":{"a":0}},` + ok + `,"normalizer":{"type":"NFKC"}}`:                              `normalizer "NFKC"`,
		`{"model":{"type":"BPE","vocab":{"a":0},"dropout":0.1},` + ok + `}`:                                             "model.dropout",
		`{"model":{"type":"BPE","vocab":{"a":0},"byte_fallback":true},` + ok + `}`:                                      "byte_fallback",
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]},` + ok + `}`:                                          `names token "b"`,
		`{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]},` + ok + `}`:                                    `makes "ab"`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]},` + ok + `}`:                                           "not two tokens",
		`{"model":{"type":"BPE","vocab":{}},` + ok + `}`:                                                                "vocab is empty",
		`{"model":{"type":"BPE","vocab":{"a":0}},"pre_tokenizer":{"type":"Whitespace"},"decoder":{"type":"ByteLevel"}}`: `pre_tokenizer "Whitespace"`,
		`{"model":{"type":"BPE","vocab":{"a":0}},"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated"},{"type":"ByteLevel"}]},"decoder":{"type":"ByteLevel"}}`: `regex "\\w+"`,
		`{"model":{"type":"BPE","vocab":{"a":0}},"pre_tokenizer":{"type":"ByteLevel"},"decoder":{"type":"WordPiece"}}`:                                                                                                         `decoder "WordPiece"`,
		`{"model":{"type":"BPE","vocab":{"a":0}},` + ok + `,"post_processor":{"type":"TemplateProcessing"}}`:                                                                                                                   `post_processor "TemplateProcessing"`,
		`{"model":{"type":"BPE","vocab":{"a":0}},` + ok + `,"truncation":{"max_length":5}}`:                                                                                                                                    "truncation",
		`{"model":{"type":"BPE","vocab":{"a":0}},` + ok + `,"added_tokens":[{"content":"<s>"}]}`:                                                                                                                               "has no id",
	}
	for in, want := range cases {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s): err = %v, want it to mention %q", in, err, want)
		} else if fe, ok := err.(*FormatError); !ok || !fe.BadInput() {
			t.Errorf("Parse(%s): %T is not a bad-input FormatError", in, err)
		}
	}
	if _, err := Load("testdata/no-such.json"); err == nil || !strings.Contains(err.Error(), "no-such.json") {
		t.Errorf("Load of a missing file: %v", err)
	}
}
