package sample

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kiln-lm/kiln/internal/bytesize"
)

// Share is one dataset's part of a mixture.
type Share struct {
	// Dataset is a preset name or local:<glob>.
	Dataset string  `json:"dataset"`
	Weight  float64 `json:"weight"`
}

// InputError is a mixture or a size the user wrote wrong.
type InputError struct{ Msg string }

func (e *InputError) Error() string  { return e.Msg }
func (e *InputError) BadInput() bool { return true }

func inputErrorf(format string, args ...any) error {
	return &InputError{fmt.Sprintf(format, args...)}
}

// ParseMix reads "the-stack-v2=0.7,fineweb-edu=0.2,proof-pile-2=0.1". The
// weights are scaled to sum to 1, so "a=7,b=3" means the same mixture.
func ParseMix(s string) ([]Share, error) {
	var out []Share
	seen := map[string]bool{}
	var sum float64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		i := strings.LastIndexByte(part, '=')
		if i <= 0 {
			return nil, inputErrorf("mixture %q: %q is not dataset=weight (for example the-stack-v2=0.7,fineweb-edu=0.3)", s, part)
		}
		name, ws := strings.TrimSpace(part[:i]), strings.TrimSpace(part[i+1:])
		w, err := strconv.ParseFloat(ws, 64)
		if err != nil || w <= 0 || math.IsInf(w, 0) || math.IsNaN(w) {
			return nil, inputErrorf("mixture %q: weight %q of %s is not a positive number", s, ws, name)
		}
		if seen[Label(name)] {
			return nil, inputErrorf("mixture %q: dataset %s is named twice (or two names differ only in punctuation); give it once with its whole weight", s, name)
		}
		seen[Label(name)] = true
		sum += w
		out = append(out, Share{Dataset: name, Weight: w})
	}
	if len(out) == 0 {
		return nil, inputErrorf("mixture %q names no dataset: give dataset=weight pairs, for example the-stack-v2=0.7,fineweb-edu=0.3", s)
	}
	for i := range out {
		out[i].Weight /= sum
	}
	return out, nil
}

// Budgets splits total bytes over the shares by weight; the rounding
// remainder goes to the first share, so the budgets sum to total.
func Budgets(shares []Share, total int64) []int64 {
	out := make([]int64, len(shares))
	var given int64
	for i, s := range shares {
		out[i] = int64(float64(total) * s.Weight)
		given += out[i]
	}
	if len(out) > 0 {
		out[0] += total - given
	}
	return out
}

// ParseSize reads the byte count to sample, as every size kiln reads
// (internal/bytesize): "2GB" (2 x 10^9), "512MiB" or "512M" (2^20 each).
// It must be more than none, and below 4 EiB, so that a share of it stays
// an int64.
func ParseSize(s string) (int64, error) {
	n, err := bytesize.Parse(s)
	if err != nil {
		return 0, inputErrorf("%v", err)
	}
	if n <= 0 || n >= 1<<62 {
		return 0, inputErrorf("size %q: sample more than 0 bytes and less than 4 EiB, such as 2GB or 500MB", s)
	}
	return n, nil
}

// Label turns a dataset name into an object-key element: "local:data/*.txt"
// becomes "local-data-.txt".
func Label(dataset string) string {
	var b strings.Builder
	dash := false
	for _, r := range dataset {
		ok := r == '-' || r == '_' || r == '.' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
		switch {
		case ok:
			b.WriteRune(r)
			dash = r == '-'
		case !dash:
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.Trim(b.String(), "-.")
	if out == "" {
		out = "dataset"
	}
	return out
}

// Prefix is where the samples of one tokenizer's mixture are kept:
// tokenizers/<name>/samples/<id>/, the id a hash of the mixture, the seed
// and the size, so a different mixture under the same name never finds
// another's samples.
func Prefix(name string, shares []Share, seed uint64, total int64) string {
	b, _ := json.Marshal(struct {
		S     []Share
		Seed  uint64
		Total int64
	}{shares, seed, total})
	h := sha256.Sum256(b)
	return "tokenizers/" + name + "/samples/" + hex.EncodeToString(h[:6]) + "/"
}

// SampleKey and HeldOutKey are one dataset's objects under prefix.
func SampleKey(prefix, dataset string) string  { return prefix + Label(dataset) + ".txt" }
func HeldOutKey(prefix, dataset string) string { return prefix + Label(dataset) + ".heldout.jsonl" }
