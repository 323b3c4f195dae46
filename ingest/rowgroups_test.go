package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/kiln-lm/kiln/tokens"
)

// manyGroups writes a parquet file of 400 documents of varied sizes in row
// groups of 7, with a null, an empty and an invalid document in the middle.
func manyGroups(t *testing.T) string {
	t.Helper()
	var rows []codeRow
	for i := range 400 {
		text := fmt.Sprintf("doc %d: ", i) + strings.Repeat("func main() { fmt.Println(\"the quick brown fox\") }\n", 1+(i*37)%40)
		rows = append(rows, codeRow{Content: strp(text), Path: fmt.Sprintf("p%d.go", i)})
	}
	rows[100].Content = nil
	rows[101].Content = strp("")
	rows[250].Content = strp("bad \xff utf8")
	path := filepath.Join(t.TempDir(), "many.parquet")
	writeParquet(t, path, rows, 7)
	return path
}

// sequential reads the file on one goroutine, as every source but parquet
// text does: the reference for the row-group decoders.
func sequential(t *testing.T, path string, opt OpenOptions) ([]Document, Skips, error) {
	t.Helper()
	opt.Columns = opt.Columns.withDefaults()
	r, err := openParquet(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	src := &textSource{r: r, skips: Skips{}}
	defer src.Close()
	return drainAll(src)
}

// decoded reads the file through a rowGroupSource of the given shape.
func decoded(t *testing.T, path string, opt OpenOptions, decoders int, segment, ahead int64) ([]Document, Skips, error) {
	t.Helper()
	opt.Columns = opt.Columns.withDefaults()
	r, err := openParquet(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	src := newRowGroupSource(r, ahead, 0)
	src.decoders, src.segment, src.ahead = decoders, segment, ahead
	defer src.Close()
	return drainAll(src)
}

// The decoders hand documents over in the file's order whatever their
// number, the segment size and the budget (down to less than one row
// group, where only the group being read makes progress), so a shard's
// bytes and hash do not depend on the machine.
func TestRowGroupsAreReadInFileOrder(t *testing.T) {
	path := manyGroups(t)
	opt := OpenOptions{Name: "many.parquet", Columns: Columns{Text: "content", ID: "path"}}
	want, wantSkips, err := sequential(t, path, opt)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 397 || wantSkips[SkipEmptyDocument] != 2 || wantSkips[SkipInvalidUTF8] != 1 {
		t.Fatalf("reference: %d documents, skips %v", len(want), wantSkips)
	}
	for _, c := range []struct {
		decoders       int
		segment, ahead int64
	}{
		{1, segmentBytes, 64 << 20},
		{8, segmentBytes, 64 << 20},
		{8, 1 << 10, 4 << 10},
		{16, 1, 1},
	} {
		got, skips, err := decoded(t, path, opt, c.decoders, c.segment, c.ahead)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || skips.String() != wantSkips.String() {
			t.Fatalf("%+v: %d documents, skips %v; want %d, %v", c, len(got), skips, len(want), wantSkips)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%+v: document %d is %q (%d bytes), want %q (%d bytes)", c, i, got[i].ID, len(got[i].Text), want[i].ID, len(want[i].Text))
			}
		}
	}
}

// A shard of a parquet file is the file's documents encoded in order, with
// EOS after each: the same bytes as encoding one document after another.
func TestShardOfAParquetFileIsInFileOrder(t *testing.T) {
	path := manyGroups(t)
	opt := OpenOptions{Columns: Columns{Text: "content"}}
	docs, _, err := sequential(t, path, opt)
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	var want []byte
	for _, d := range docs {
		want = tokens.Encode(want, tokens.DtypeFor(tok.VocabSize()), append(tok.Encode(d.Text), eos))
	}
	src, err := Open(context.Background(), path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var got bytes.Buffer
	st, err := WriteShard(context.Background(), src, tok, &got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) || st.Documents != int64(len(docs)) {
		t.Fatalf("shard of %d bytes, %d documents; want %d bytes, %d documents", got.Len(), st.Documents, len(want), len(docs))
	}
}

// A row group that cannot be decoded ends the file where it starts: the
// documents before it come first, as when reading on one goroutine, and
// the error is the corrupt-file skip.
func TestCorruptRowGroupEndsTheFileInOrder(t *testing.T) {
	path := manyGroups(t)
	opt := OpenOptions{Columns: Columns{Text: "content"}}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	pf, err := parquet.OpenFile(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := pf.Schema().Lookup("content")
	off := pf.Metadata().RowGroups[30].Columns[leaf.ColumnIndex].MetaData.DataPageOffset
	f.Close()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copy(b[off:], bytes.Repeat([]byte{0xff}, 16)) // the page header
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	want, _, wantErr := sequential(t, path, opt)
	if SkipReason(wantErr) != SkipCorruptFile || len(want) < 30*7-3 {
		t.Fatalf("reference: %d documents, %v", len(want), wantErr)
	}
	got, _, err := decoded(t, path, opt, 8, 1<<10, 4<<10)
	if SkipReason(err) != SkipCorruptFile || len(got) != len(want) {
		t.Fatalf("%d documents then %v; want %d then %v", len(got), err, len(want), wantErr)
	}
}

// Closing a file part way, or reading it under a canceled context, stops
// its decoders: nothing outlives Close.
func TestRowGroupDecodersStopAtClose(t *testing.T) {
	path := manyGroups(t)
	before := runtime.NumGoroutine()
	src, err := Open(context.Background(), path, OpenOptions{Columns: Columns{Text: "content"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := src.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after Close, %d before", n, before)
	}

	ctx, cancel := context.WithCancel(context.Background())
	src, err = Open(ctx, path, OpenOptions{Columns: Columns{Text: "content"}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := src.Next(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	for {
		_, err := src.Next(ctx)
		if errors.Is(err, context.Canceled) {
			break
		}
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("after cancel: %v", err)
		}
		if errors.Is(err, io.EOF) {
			t.Fatal("read to the end after cancel")
		}
	}
}
