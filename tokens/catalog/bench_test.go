package catalog

import (
	"context"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokenizer/tokenizertest"
)

// BenchmarkMeasure is the report's cost per held-out byte with a previous
// tokenizer to compare (two encodes of every document). Bytes/s is
// held-out text measured.
func BenchmarkMeasure(b *testing.B) {
	code, prose := tokenizertest.Text(b, "go")+tokenizertest.Text(b, "python"), tokenizertest.Text(b, "english")
	maths := mathsCorpus(2, 3000)
	data := train(b, 4096, code, prose, maths)
	tok, err := tokenizer.Parse(data)
	if err != nil {
		b.Fatal(err)
	}
	prevTok, _ := tokenizer.Parse(train(b, 2048, prose))
	e := entryOf("bench", "", tok)
	pe := entryOf("prev", "", prevTok)
	held := []HeldOut{{"code", tokenizertest.Documents(code, 2000)}, {"prose", tokenizertest.Documents(prose, 2000)}, {"maths", tokenizertest.Documents(maths, 2000)}}
	b.SetBytes(int64(len(code) + len(prose) + len(maths)))
	b.ResetTimer()
	for range b.N {
		if _, err := Measure(context.Background(), e, tok, &pe, prevTok, held); err != nil {
			b.Fatal(err)
		}
	}
}
