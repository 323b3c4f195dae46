package ingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

type idRow struct {
	Text string `parquet:"text"`
	ID   string `parquet:"id"`
}

// parquetWithFooter is a file of footer alone: the magic, the footer, its
// length and the magic again.
func parquetWithFooter(footer []byte) []byte {
	b := append([]byte("PAR1"), footer...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(footer)))
	return append(b, "PAR1"...)
}

// refooted is the parquet file good with its footer decoded, changed by
// edit and encoded again: a file whose pages are a writer's and whose
// footer claims what edit says.
func refooted(t *testing.T, good []byte, edit func(*format.FileMetaData)) []byte {
	t.Helper()
	n := int(binary.LittleEndian.Uint32(good[len(good)-8:]))
	data := good[:len(good)-8-n]
	var proto thrift.CompactProtocol
	var md format.FileMetaData
	if err := thrift.Unmarshal(&proto, good[len(good)-8-n:len(good)-8], &md); err != nil {
		t.Fatal(err)
	}
	edit(&md)
	footer, err := thrift.Marshal(&proto, &md)
	if err != nil {
		t.Fatal(err)
	}
	b := append(bytes.Clone(data), footer...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(footer)))
	return append(b, "PAR1"...)
}

// schemaBomb is the 21-byte file whose footer's schema is a list of
// 2^31-1 elements (0xFC: structs, their number next).
var schemaBomb = parquetWithFooter([]byte{0x15, 0x02, 0x19, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0x07})

// Footers in Thrift's compact protocol, written by hand where no writer
// would: a field header is its id's delta from the last one's over its
// type (0x15: the next id, an i32), a list header its size over its
// elements' type (0x19: one element, a list; 0xFC: a size that follows,
// of structs).

// gridFooter is a schema of n columns and n row groups that list no
// column chunk, every count true to its bytes: the library allocates a
// chunk for each column of each row group (n*n) before it finds the row
// groups empty, 80 GB for n = 100,000 in a file of 1.3 MB.
func gridFooter(n int) []byte {
	// Version 1; the schema, of the root and n columns.
	f := []byte{0x15, 0x02, 0x19, 0xFC}
	f = binary.AppendUvarint(f, uint64(n+1))
	// The root, named r, of n children (an i32 is zigzag: n<<1).
	f = append(f, 0x48, 0x01, 'r', 0x15)
	f = binary.AppendUvarint(f, uint64(n)<<1)
	f = append(f, 0x00)
	for range n { // a byte array column named c
		f = append(f, 0x15, 0x0C, 0x38, 0x01, 'c', 0x00)
	}
	// No rows; n row groups of no column chunk, no bytes, no rows.
	f = append(f, 0x16, 0x00, 0x19, 0xFC)
	f = binary.AppendUvarint(f, uint64(n))
	for range n {
		f = append(f, 0x19, 0x0C, 0x16, 0x00, 0x16, 0x00, 0x00)
	}
	return append(f, 0x00)
}

// deepSchemaFooter is a schema of groups each holding the next, depth
// deep, then the text column, and no row group.
func deepSchemaFooter(depth int) []byte {
	f := []byte{0x15, 0x02, 0x19, 0xFC}
	f = binary.AppendUvarint(f, uint64(depth+1))
	for range depth { // a group named g, of one child
		f = append(f, 0x48, 0x01, 'g', 0x15, 0x02, 0x00)
	}
	f = append(f, 0x15, 0x0C, 0x38, 0x04, 't', 'e', 'x', 't', 0x00)
	return append(f, 0x16, 0x00, 0x19, 0x0C, 0x00)
}

// allocated is the memory f allocates, sizes the library only asked for
// included.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A parquet file whose footer or row group claims more than its bytes
// hold is skipped as a corrupt file, naming it, within the memory its
// bytes take: the library decoded the footer into values sized by its
// counts, and kiln sized a row group's ids by its row count, so that a
// 21-byte file asked for 206 GB and a row group claiming 2^33 rows for
// 128 GB. The Go runtime meets such an allocation with a fatal error, not
// a panic: it ended the worker with every task it ran, at every retry
// (without the fix, this test's binary dies the same way). A good file
// beside them reads whole.
func TestParquetFooterThatClaimsTooMuchIsACorruptFileNotACrash(t *testing.T) {
	dir := t.TempDir()
	rows := []idRow{{"package main\nfunc main() {}\n", "a"}, {"hello world", "b"}, {"third doc", "c"}}
	good := filepath.Join(dir, "good.parquet")
	writeParquet(t, good, rows, 3)
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	encrypted := parquetWithFooter(append([]byte{0x09, 0xC8, 0x01}, bytes.Repeat([]byte{0x19}, 4<<20)...))
	copy(encrypted[len(encrypted)-4:], "PARE")
	footerLength := bytes.Clone(goodBytes)
	binary.LittleEndian.PutUint32(footerLength[len(footerLength)-8:], 0xFFFFFFF0)

	for _, c := range []struct {
		name string
		file []byte
		want string
	}{
		// Its schema a list of 2^31-1 elements: 21 bytes.
		{"schema.parquet", schemaBomb,
			"its parquet footer is corrupt (a list of 2147483647 elements in 0 bytes): the file is damaged; download it again or leave it out"},
		// Its row groups (field 4) the same.
		{"rowgroups.parquet", parquetWithFooter([]byte{0x15, 0x02, 0x39, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0x07}),
			"(a list of 2147483647 elements in 0 bytes)"},
		// Its created_by (field 6) a string of 2^31-1 bytes.
		{"string.parquet", parquetWithFooter([]byte{0x15, 0x02, 0x58, 0xFF, 0xFF, 0xFF, 0xFF, 0x07}),
			"(a string of 2147483647 bytes in 0 bytes)"},
		// A field the library does not know (id 100), of lists nested 4 Mi
		// deep: it skips them by recursion, past the goroutine stack's
		// 1 GB (a fatal error too).
		{"nested.parquet", parquetWithFooter(append([]byte{0x15, 0x02, 0x09, 0xC8, 0x01}, bytes.Repeat([]byte{0x19}, 4<<20)...)),
			"(values nested more than 64 deep)"},
		// The same in a footer marked encrypted (PARE), which the library
		// decodes as the key's metadata before it finds no key.
		{"encrypted.parquet", encrypted,
			"(values nested more than 64 deep)"},
		{"grid.parquet", parquetWithFooter(gridFooter(100_000)),
			"(a row group of 0 column chunks for a schema of 100000 columns)"},
		{"deep.parquet", parquetWithFooter(deepSchemaFooter(40)),
			"(a schema nested more than 32 levels deep)"},
		{"footerlength.parquet", footerLength,
			"(a footer of 4294967280 bytes in a file of"},
		// A writer's file whose row group claims 2^33 rows: its pages
		// hold 3.
		{"rows.parquet", refooted(t, goodBytes, func(md *format.FileMetaData) {
			md.NumRows, md.RowGroups[0].NumRows = 1<<33, 1<<33
		}), "row group 0 ended after 3 of 8589934592 rows"},
		// And one claiming 2 rows, its id column holding a value more.
		{"fewer.parquet", refooted(t, goodBytes, func(md *format.FileMetaData) {
			md.NumRows, md.RowGroups[0].NumRows = 2, 2
		}), `row group 0: column "id" has more values than its 2 rows`},
	} {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, c.file, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Run(c.name, func(t *testing.T) {
			opt := OpenOptions{Name: "data/" + c.name, Columns: Columns{Text: "text", ID: "id"}}
			var docs []Document
			var err error
			n := allocated(func() { docs, _, err = readAll(t, path, opt) })
			if SkipReason(err) != SkipCorruptFile || !strings.HasPrefix(err.Error(), opt.Name+": skipped (corrupt-file): ") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%d documents, then %v; want a corrupt-file skip naming it and saying %q", len(docs), err, c.want)
			}
			if n > 64<<20+uint64(len(c.file)) {
				t.Errorf("reading its %d bytes allocated %d MiB", len(c.file), n>>20)
			}
			// On one goroutine, as a blob dataset's file is read.
			r, err := openParquet(path, opt)
			if err == nil {
				src := &textSource{r: r, skips: Skips{}}
				_, _, err = drainAll(src)
				src.Close()
			}
			if SkipReason(err) != SkipCorruptFile || !strings.Contains(err.Error(), c.want) {
				t.Errorf("on one goroutine: %v; want %q", err, c.want)
			}
		})
	}

	// A blob dataset reads no text: the row group claiming 2^33 rows ends
	// at the blob ids' last.
	t.Run("blobs", func(t *testing.T) {
		r, err := openParquet(filepath.Join(dir, "rows.parquet"), OpenOptions{Name: "data/rows.parquet", Columns: Columns{Blob: "id"}})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		var blobs []string
		for {
			rec, err := r.next(context.Background())
			if err != nil {
				if want := `row group 0: column "id" has 3 values for 8589934592 rows`; SkipReason(err) != SkipCorruptFile || !strings.Contains(err.Error(), want) || len(blobs) != 3 {
					t.Fatalf("blob ids %v, then %v; want 3, then %q", blobs, err, want)
				}
				break
			}
			blobs = append(blobs, rec.blob)
		}
	})

	docs, _, err := readAll(t, good, OpenOptions{Columns: Columns{Text: "text", ID: "id"}})
	if err != nil || len(docs) != 3 || docs[0].ID != "a" || docs[2].ID != "c" || docs[1].Text != "hello world" {
		t.Fatalf("the good file: %+v, %v", docs, err)
	}
}

// datasets check opens a parquet file through the same check, a local
// dataset's and a hub dataset's (through Range requests): the 21-byte file
// is named as not readable, its footer corrupt, where it ended the
// command with the Go runtime's fatal error. A good hub file's footer is
// read from the hub once, the check's read serving the library's.
func TestDatasetsCheckRefusesAParquetFooterThatClaimsTooMuch(t *testing.T) {
	const want = "is not readable parquet: its parquet footer is corrupt (a list of 2147483647 elements in 0 bytes)"
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "s.parquet"), schemaBomb, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := LookupPreset(nil, LocalPrefix+filepath.Join(dir, "*.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Check(context.Background(), p, nil); !isPresetError(err) || !strings.Contains(err.Error(), "s.parquet "+want) {
		t.Fatalf("local: %v; want a preset error saying %q", err, want)
	}

	h := hubtest.New()
	defer h.Close()
	h.Add("o/bomb", "data/a.parquet", schemaBomb, true)
	h.Add("o/good", "data/a.parquet", parquetBytes(t, []textRow{{Text: "a"}, {Text: "b"}}), true)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	p = Preset{Name: "bomb", Repo: "o/bomb", Revision: "main", Include: []string{"data/*.parquet"}}
	if _, err := Check(context.Background(), p, hc); err == nil || !strings.Contains(err.Error(), "dataset bomb: data/a.parquet "+want) {
		t.Fatalf("hub: %v; want %q", err, want)
	}
	ranges := func() int {
		n := 0
		for _, r := range h.Requests() {
			if r.Host == "cdn" && r.Range != "" {
				n++
			}
		}
		return n
	}
	before := ranges()
	p = Preset{Name: "good", Repo: "o/good", Revision: "main", Include: []string{"data/*.parquet"}}
	if res, err := Check(context.Background(), p, hc); err != nil || strings.Join(res.Columns, ",") != "text" {
		t.Fatalf("the good hub file: %+v, %v", res, err)
	}
	if n := ranges() - before; n != 3 {
		t.Fatalf("the good hub file took %d Range requests; want 3 (its head, its footer's length, its footer)", n)
	}
}
