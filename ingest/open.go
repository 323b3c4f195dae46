package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Format names how a file's bytes become documents.
type Format string

const (
	FormatParquet Format = "parquet"
	FormatJSONL   Format = "jsonl" // also .jsonl.gz and .jsonl.zst, by name
	FormatText    Format = "text"  // the whole file is one document
)

// Columns says where a file keeps what ingest reads.
type Columns struct {
	// Text is the parquet column or JSON field holding the document
	// (default "text"). Unused when Blob is set.
	Text string `yaml:"text,omitempty" json:"text,omitempty"`
	// ID is an optional column with a stable document id.
	ID string `yaml:"id,omitempty" json:"id,omitempty"`
	// Blob, when set, is a column of Software Heritage blob ids: the text is
	// fetched from Software Heritage rather than read from the file.
	Blob string `yaml:"blob,omitempty" json:"blob,omitempty"`
	// Encoding is the column with each blob's src_encoding (default UTF-8).
	Encoding string `yaml:"encoding,omitempty" json:"encoding,omitempty"`
}

func (c Columns) withDefaults() Columns {
	if c.Text == "" {
		c.Text = "text"
	}
	return c
}

// FormatOf infers a file's format from its name.
func FormatOf(name string) Format {
	switch {
	case strings.HasSuffix(name, ".parquet"):
		return FormatParquet
	case strings.HasSuffix(name, ".jsonl"), strings.HasSuffix(name, ".jsonl.gz"), strings.HasSuffix(name, ".jsonl.zst"),
		strings.HasSuffix(name, ".json.gz"), strings.HasSuffix(name, ".json.zst"):
		return FormatJSONL
	}
	return FormatText
}

// formatOfFile is FormatOf, but for a .json file, which is read as JSON
// lines where its first line is a JSON object holding the field the
// preset reads (many datasets keep JSON lines in .json files) and as
// plain text otherwise (a project's package.json, a config: source code).
func formatOfFile(path string, c Columns) Format {
	if !strings.HasSuffix(path, ".json") {
		return FormatOf(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return FormatText // the text reader says why it cannot
	}
	defer f.Close()
	head := make([]byte, jsonSniffBytes)
	n, _ := io.ReadFull(f, head)
	return jsonLinesOrText(head[:n], c)
}

// jsonSniffBytes is how much of a .json file formatOfFile reads: a first
// line longer than that (a document of more) reads as plain text.
const jsonSniffBytes = 1 << 20

// jsonLinesOrText says how a .json file that begins with head is read.
func jsonLinesOrText(head []byte, c Columns) Format {
	head = bytes.TrimPrefix(head, []byte("\uFEFF"))
	line, _, ok := bytes.Cut(head, []byte("\n"))
	if !ok && len(head) == jsonSniffBytes {
		return FormatText
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(line, &fields) != nil {
		return FormatText
	}
	c = c.withDefaults()
	field := c.Text
	if c.Blob != "" {
		field = c.Blob
	}
	if _, ok := fields[field]; ok {
		return FormatJSONL
	}
	return FormatText
}

// OpenOptions are what Open needs beyond the file.
type OpenOptions struct {
	Columns Columns
	// Name is the document id prefix (the file's path in its dataset).
	Name string
	// SWH fetches blobs when Columns.Blob is set.
	SWH *SWH
	// DecodeAhead is the text a parquet file's row-group decoders may hold
	// ahead of the reader (0: DefaultDecodeAhead()).
	DecodeAhead int64
	// From is the first record read: the records before it (rows, or
	// lines of JSON) are passed over, their blobs not fetched, their row
	// groups not decoded where they lie wholly before it. A file's rest
	// after the part of it a store holds starts there (tokens.Part).
	From int64
}

// Open returns the documents of the local file at path. A file that cannot
// be opened as its format is a *SkipError.
func Open(ctx context.Context, path string, opt OpenOptions) (Source, error) {
	opt.Columns = opt.Columns.withDefaults()
	if opt.Name == "" {
		opt.Name = path
	}
	var rows recordReader
	var err error
	switch formatOfFile(path, opt.Columns) {
	case FormatParquet:
		pr, err := openParquet(path, opt)
		if err != nil {
			return nil, err
		}
		if opt.Columns.Blob == "" {
			return newRowGroupSource(pr, opt.DecodeAhead, opt.From), nil
		}
		rows = pr
	case FormatJSONL:
		rows, err = openJSONL(path, opt)
	default:
		if opt.Columns.Blob != "" {
			return nil, fmt.Errorf("%s: Software Heritage blob ids need a parquet or JSON lines file", path)
		}
		return openText(path, opt)
	}
	if err != nil {
		return nil, err
	}
	if opt.Columns.Blob == "" {
		return &textSource{r: rows, skips: Skips{}, from: opt.From}, nil
	}
	if opt.SWH == nil {
		rows.Close()
		return nil, fmt.Errorf("%s: blob ids in column %q need a Software Heritage client", path, opt.Columns.Blob)
	}
	return opt.SWH.documentsFrom(ctx, rows, opt.From), nil
}
