package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Format names how a file's bytes become documents.
type Format string

const (
	FormatParquet Format = "parquet"
	FormatJSONL   Format = "jsonl" // also .jsonl.gz and .jsonl.zst by name, and .json by its head
	// FormatJSONArray is a .json file (plain, gzip or zstd) of one JSON
	// array of objects, each element a record, told by its head
	// (jsonFormat).
	FormatJSONArray Format = "json-array"
	FormatText      Format = "text" // the whole file is one document
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

// field is the JSON field or column each record is read from: the blob
// ids' where they are read, else the text's.
func (c Columns) field() string {
	if c.Blob != "" {
		return c.Blob
	}
	return c.withDefaults().Text
}

// FormatOf infers a file's format from its name. A .json file, plain or
// compressed, is told by its head (formatOfFile): by name it is text.
func FormatOf(name string) Format {
	switch {
	case strings.HasSuffix(name, ".parquet"):
		return FormatParquet
	case strings.HasSuffix(name, ".jsonl"), strings.HasSuffix(name, ".jsonl.gz"), strings.HasSuffix(name, ".jsonl.zst"):
		return FormatJSONL
	}
	return FormatText
}

// isJSON says whether name is a .json file, plain or compressed (.json.gz,
// .json.zst), which is read as its head says (jsonFormat): exporters
// compress the same files that they write as .json, JSON lines or one
// array, and a source tree keeps compressed configs.
func isJSON(name string) bool {
	return strings.HasSuffix(name, ".json") || compressedJSON(name)
}

// jsonRecords says whether the file named name may hold JSON records: a
// JSON lines file by its name, a .json file, plain or compressed, as its
// head says (formatOfHead). Of these the check reads the head.
func jsonRecords(name string) bool {
	return FormatOf(name) == FormatJSONL || isJSON(name)
}

// compressedJSON says whether name is a .json.gz or .json.zst file.
func compressedJSON(name string) bool {
	return strings.HasSuffix(name, ".json.gz") || strings.HasSuffix(name, ".json.zst")
}

// compressedText says whether name is a gzip (.gz) or zstd (.zst) file that
// is read as the text it decompresses to: a corpus kept as .txt.gz, a
// source file or a config compressed in a tree. One that holds a tar
// archive (.tar.gz) is skipped as an archive by its first header.
func compressedText(name string) bool {
	return strings.HasSuffix(name, ".gz") || strings.HasSuffix(name, ".zst")
}

// formatOfFile is how ingest reads the local file at path: as its name
// says, but a .json file, plain or compressed, as its head says
// (formatOfHead).
func formatOfFile(path string, c Columns) Format {
	if !isJSON(path) {
		return FormatOf(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return FormatText // the text reader says why it cannot
	}
	defer f.Close()
	// A file that cannot be read or decompressed is text here, and its
	// reader says why.
	head, _ := jsonHead(f, path)
	return formatOfHead(path, head, c)
}

// formatOfHead is how ingest reads the file named name whose head
// (jsonHead) is head, a local file's or a hub file's alike: FormatOf its
// name, but a .json file, plain or compressed, as its first record says
// (jsonFormat).
func formatOfHead(name string, head []byte, c Columns) Format {
	if isJSON(name) {
		return jsonFormat(head, c)
	}
	return FormatOf(name)
}

// jsonSniffBytes is how much of a .json file formatOfFile reads: a first
// line longer than that (a document of more), or a first array element
// whose fields before the one read are longer, reads as plain text.
const jsonSniffBytes = 1 << 20

// jsonHead reads from r the head of the file of JSON records named name
// (jsonRecords) that jsonFormat and the check read: its first
// jsonSniffBytes bytes, or all of them where it is shorter, decompressed
// where name says it is compressed. Of a compressed file (.gz, .zst) it
// reads at most twice that, more than any compressor takes to hold a head
// of jsonSniffBytes (a stored block adds a few bytes in 64 KiB). A stream
// cut short or corrupt gives what was decompressed before the fault, and
// the file's reader skips it as corrupt. The error is r's alone (a failed
// request for a hub file's bytes).
func jsonHead(r io.Reader, name string) ([]byte, error) {
	in := &readErr{r: r}
	var src io.Reader = in
	if compressedText(name) {
		src = io.LimitReader(in, 2*jsonSniffBytes)
	}
	z, err := decompressed(src, name)
	if err != nil {
		return nil, in.err
	}
	defer z.Close()
	head := make([]byte, jsonSniffBytes)
	n, _ := io.ReadFull(z, head)
	return head[:n], in.err
}

// readErr is r, keeping the first error other than io.EOF that r gave.
type readErr struct {
	r   io.Reader
	err error
}

func (r *readErr) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && r.err == nil {
		r.err = err
	}
	return n, err
}

// jsonFormat says how a .json file that begins with head (decompressed,
// where it is compressed) is read. Many datasets keep their records in
// .json files, as JSON lines or as one JSON array of objects
// (pretty-printed or not); a project's package.json, a config or a list
// of fixtures is source code. The file's first record tells them apart:
// the file is JSON lines where its first line is a JSON object holding
// the field read, a JSON array where its first element is an object
// holding it (or where the array is empty), and plain text otherwise. An
// array whose first element lacks the field is text, as such a first
// line is, not an error: a source tree's .json arrays are its code, and a
// dataset's field misspelt shows in 'sched datasets check', which says
// that its files are read as plain text.
func jsonFormat(head []byte, c Columns) Format {
	head = bytes.TrimPrefix(head, []byte("\uFEFF"))
	field := c.field()
	if rest := bytes.TrimLeft(head, " \t\r\n"); len(rest) > 0 && rest[0] == '[' {
		if firstElementHolds(rest, field) {
			return FormatJSONArray
		}
		return FormatText
	}
	line, _, ok := bytes.Cut(head, []byte("\n"))
	if !ok && len(head) == jsonSniffBytes {
		return FormatText
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(line, &fields) != nil {
		return FormatText
	}
	if _, ok := fields[field]; ok {
		return FormatJSONL
	}
	return FormatText
}

// firstElementHolds says whether head begins a JSON array whose first
// element is an object with field among its own (not nested) fields, or
// an empty array: a dataset's file of no records, skipped as empty, where
// its "[]" would be a document. It reads no further than that field's
// name, so that a first document longer than the head, its field named
// first, does not make the file text.
func firstElementHolds(head []byte, field string) bool {
	dec := json.NewDecoder(bytes.NewReader(head))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return false
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return err == nil && tok == json.Delim(']')
	}
	for dec.More() {
		name, err := dec.Token()
		if err != nil {
			return false
		}
		if name == field {
			return true
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return false
		}
	}
	return false
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
	// From is the first record read: the records before it (rows, lines
	// of JSON, or a JSON array's elements) are passed over, their blobs not fetched, their row
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
	case FormatJSONArray:
		rows, err = openJSONArray(path, opt)
	default:
		if opt.Columns.Blob != "" {
			return nil, fmt.Errorf("%s: Software Heritage blob ids need a parquet, JSON lines or JSON array file", path)
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
