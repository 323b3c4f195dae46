package ingest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// A parquet file whose page header says more nulls than the page holds
// values (the library trusts it, and sizes a buffer from the difference)
// is skipped as corrupt-file, naming it, after the row groups before the
// damage: it does not panic, which ended the worker's process and every
// task it ran, and the task's retries on the next worker the same way. A
// file cut short is the same skip.
func TestDamagedParquetIsACorruptFileNotACrash(t *testing.T) {
	path := manyGroups(t)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := parquet.OpenFile(f, int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := pf.Schema().Lookup("content")
	off := pf.Metadata().RowGroups[30].Columns[leaf.ColumnIndex].MetaData.DataPageOffset
	f.Close()

	// The page header, rewritten with as many bytes as it had.
	var proto thrift.CompactProtocol
	var h format.PageHeader
	if err := thrift.NewDecoder(proto.NewReader(bytes.NewReader(good[off:]))).Decode(&h); err != nil {
		t.Fatal(err)
	}
	if !h.DataPageHeaderV2.Valid {
		t.Fatalf("the page at %d is not a data page v2: %+v", off, h)
	}
	was, err := thrift.Marshal(&proto, &h)
	if err != nil || !bytes.Equal(was, good[off:off+int64(len(was))]) {
		t.Fatalf("the page header does not encode back to its bytes: %v", err)
	}
	h.DataPageHeaderV2.V.NumNulls = h.DataPageHeaderV2.V.NumValues + 20
	now, err := thrift.Marshal(&proto, &h)
	if err != nil || len(now) != len(was) {
		t.Fatalf("the damaged header takes %d bytes, not %d: %v", len(now), len(was), err)
	}
	damaged := bytes.Clone(good)
	copy(damaged[off:], now)

	opt := OpenOptions{Name: "data/damaged.parquet", Columns: Columns{Text: "content"}}
	read := func(what string, b []byte) []Document {
		t.Helper()
		p := filepath.Join(t.TempDir(), "damaged.parquet")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		docs, _, err := readAll(t, p, opt)
		if SkipReason(err) != SkipCorruptFile || !strings.Contains(err.Error(), opt.Name) {
			t.Fatalf("%s: %v; want a corrupt-file skip naming %s", what, err, opt.Name)
		}
		return docs
	}
	read("cut in half", good[:len(good)/2])
	docs := read("a page header with more nulls than values", damaged)
	p := filepath.Join(t.TempDir(), "damaged.parquet")
	if err := os.WriteFile(p, damaged, 0o644); err != nil {
		t.Fatal(err)
	}
	want, _, err := sequential(t, p, opt)
	if SkipReason(err) != SkipCorruptFile || len(docs) != len(want) || len(want) < 30*7-3 {
		t.Fatalf("%d documents before the damage; on one goroutine %d, then %v", len(docs), len(want), err)
	}
}
