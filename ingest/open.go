package ingest

import (
	"context"
	"fmt"
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
	switch FormatOf(path) {
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
