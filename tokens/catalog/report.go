package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// ReportKey and ReportMarkdownKey are where a tokenizer's report is kept,
// beside its tokenizer.json.
func ReportKey(name string) string         { return Prefix + name + "/report.json" }
func ReportMarkdownKey(name string) string { return Prefix + name + "/report.md" }

// HeldOut is text of one source that the tokenizer did not train on.
type HeldOut struct {
	Source string
	Docs   []string
}

// Figures is one tokenizer's compression of one source's held-out text.
type Figures struct {
	Tokens int64 `json:"tokens"`
	// BytesPerToken is UTF-8 bytes over tokens: higher packs more text
	// into each training token. A tokenizer that never saw a kind of text
	// falls towards 1-2 on it (single characters).
	BytesPerToken float64 `json:"bytes_per_token"`
}

// SourceReport is the compression of one source.
type SourceReport struct {
	Source    string `json:"source"`
	Documents int    `json:"documents"`
	Bytes     int64  `json:"bytes"`
	Figures
	// Previous is the previous tokenizer on the same text, when there is one.
	Previous *Figures `json:"previous,omitempty"`
}

// Report describes a trained tokenizer.
type Report struct {
	Name      string `json:"name"`
	SHA256    string `json:"sha256"`
	VocabSize int    `json:"vocab_size"`
	// Asked is the vocabulary the training was asked for, when it yielded
	// fewer ids (0 otherwise).
	Asked         int            `json:"asked,omitempty"`
	SpecialTokens []string       `json:"special_tokens"`
	Sources       []SourceReport `json:"sources"`
	// Previous names the tokenizer compared against, if any.
	Previous *Entry `json:"previous,omitempty"`
	// Sample is the object prefix of the text it was trained on, which
	// tells a retried training that this report is its own.
	Sample string `json:"sample,omitempty"`
}

// Measure reports tok's compression of each source's held-out text, beside
// prev's (nil when there is no previous tokenizer). Empty documents count
// neither bytes nor tokens.
func Measure(ctx context.Context, e Entry, tok *tokenizer.Tokenizer, prev *Entry, prevTok *tokenizer.Tokenizer, held []HeldOut) (Report, error) {
	r := Report{Name: e.Name, SHA256: e.SHA256, VocabSize: e.VocabSize, SpecialTokens: e.Special, Sources: []SourceReport{}}
	if prevTok != nil {
		r.Previous = prev
	}
	for _, h := range held {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		sr := SourceReport{Source: h.Source, Documents: len(h.Docs)}
		var prevTokens int64
		for i, d := range h.Docs {
			if i%256 == 0 {
				if err := ctx.Err(); err != nil {
					return r, err
				}
			}
			sr.Bytes += int64(len(d))
			sr.Tokens += int64(len(tok.Encode(d)))
			if prevTok != nil {
				prevTokens += int64(len(prevTok.Encode(d)))
			}
		}
		sr.BytesPerToken = ratio(sr.Bytes, sr.Tokens)
		if prevTok != nil {
			sr.Previous = &Figures{Tokens: prevTokens, BytesPerToken: ratio(sr.Bytes, prevTokens)}
		}
		r.Sources = append(r.Sources, sr)
	}
	return r, nil
}

func ratio(b, t int64) float64 {
	if t == 0 {
		return 0
	}
	return float64(b) / float64(t)
}

// Markdown renders the report for a person: the vocabulary, the special
// tokens, and a table of bytes per token per source.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Tokenizer %s\n\n", r.Name)
	fmt.Fprintf(&b, "- vocabulary: %d ids\n", r.VocabSize)
	if msg := tokenizer.Shortfall(r.VocabSize, r.Asked, 0); msg != "" {
		fmt.Fprintf(&b, "- **fewer ids than asked**: %s\n", msg)
	}
	fmt.Fprintf(&b, "- sha256: %s\n- special tokens: %s\n", r.SHA256, strings.Join(quoteAll(r.SpecialTokens), ", "))
	if r.Previous != nil {
		fmt.Fprintf(&b, "- previous: %s (%d ids, sha256 %s)\n", r.Previous.Name, r.Previous.VocabSize, r.Previous.SHA256)
	}
	b.WriteString("\nBytes per token on held-out text of each source (higher is better):\n\n")
	if r.Previous != nil {
		fmt.Fprintf(&b, "| source | documents | bytes | tokens | bytes/token | %s bytes/token | change |\n|---|---:|---:|---:|---:|---:|---:|\n", r.Previous.Name)
	} else {
		b.WriteString("| source | documents | bytes | tokens | bytes/token |\n|---|---:|---:|---:|---:|\n")
	}
	for _, s := range r.Sources {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.3f |", s.Source, s.Documents, s.Bytes, s.Tokens, s.BytesPerToken)
		if r.Previous != nil {
			if s.Previous != nil && s.Previous.BytesPerToken > 0 {
				fmt.Fprintf(&b, " %.3f | %+.1f%% |", s.Previous.BytesPerToken, 100*(s.BytesPerToken/s.Previous.BytesPerToken-1))
			} else {
				b.WriteString(" - | - |")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// PutReport stores r as report.json and report.md beside the tokenizer in
// object storage and in the local directory.
func (c *Catalog) PutReport(ctx context.Context, r Report) error {
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report of tokenizer %s: %w", r.Name, err)
	}
	md := []byte(r.Markdown())
	for key, data := range map[string][]byte{ReportKey(r.Name): append(js, '\n'), ReportMarkdownKey(r.Name): md} {
		if c.Objects != nil {
			if err := c.Objects.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
				return fmt.Errorf("store report of tokenizer %s: %w", r.Name, err)
			}
		}
		local := filepath.Join(c.Dir, filepath.FromSlash(strings.TrimPrefix(key, Prefix)))
		if err := writeAtomic(local, data); err != nil {
			return err
		}
	}
	return nil
}

// GetReport reads the report of tokenizer name from object storage, else
// from the local directory; ok is false when it has none.
func (c *Catalog) GetReport(ctx context.Context, name string) (r Report, ok bool, err error) {
	var data []byte
	if c.Objects != nil {
		rc, gerr := c.Objects.Get(ctx, ReportKey(name))
		switch {
		case errors.Is(gerr, store.ErrNotFound):
		case gerr != nil:
			return r, false, fmt.Errorf("get %s: %w", ReportKey(name), gerr)
		default:
			data, err = io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return r, false, fmt.Errorf("get %s: %w", ReportKey(name), err)
			}
		}
	}
	if data == nil {
		b, rerr := os.ReadFile(filepath.Join(c.Dir, name, "report.json"))
		if errors.Is(rerr, fs.ErrNotExist) {
			return r, false, nil
		}
		if rerr != nil {
			return r, false, rerr
		}
		data = b
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, false, fmt.Errorf("%s is not a report (%v): re-run the tokenizer's training to rewrite it", ReportKey(name), err)
	}
	return r, true, nil
}
