package ingest

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// The parquet library decodes a file's footer (its FileMetaData, in
// Thrift's compact protocol) into Go values sized by the counts the footer
// gives, before it has read what they count: a footer of nine bytes that
// claims a list of 2^31 schema elements is a 206 GB allocation, which the
// Go runtime meets with a fatal error that no recover catches, ending the
// worker's process with every task it runs (and at each retry of the
// task). checkParquetFooter walks the encoding first, allocating nothing,
// and refuses what no footer of those bytes could hold.

// footerNesting bounds the nesting of a footer's Thrift values: the
// library skips a field it does not know by recursion, so a footer of
// nested lists a few megabytes long would exhaust the goroutine's stack,
// another fatal error. A real footer nests about ten deep (a row group's
// column chunk's metadata's statistics).
const footerNesting = 64

// maxSchemaDepth bounds the nesting of a file's schema. The library keeps
// each column's path from the root, names slab-allocated for the whole
// schema before it checks any of them, so the schema's depth multiplies
// what its elements cost. A list of structs is three or four levels deep;
// 32 is far past any dataset's.
const maxSchemaDepth = 32

// footerError is a parquet footer whose counts claim more than its bytes
// hold: what the file's reader would have allocated from it. It is
// permanent, the file's own damage.
type footerError struct{ what string }

func (e *footerError) Error() string {
	return "its parquet footer is corrupt (" + e.what + "): the file is damaged; download it again or leave it out"
}

func corruptFooter(format string, args ...any) error {
	return &footerError{fmt.Sprintf(format, args...)}
}

// checkParquetFooter reads the footer of the parquet file r (size bytes)
// and checks it before the library decodes it: the footer lies within the
// file, every list, set and map claims no more elements than there are
// bytes left to hold them (each element takes at least one) and every
// string fits, the values nest no deeper than footerNesting, the schema no
// deeper than maxSchemaDepth, and each row group has a column chunk for
// each of the schema's columns (the library allocates one for each column
// of each row group, whatever the row group lists). It returns the file's
// last bytes, footer included, for the library to read from memory
// (footerCache), or nil where the file is too short to end in a footer
// or ends in no parquet magic, which the library refuses by itself. An
// encrypted footer (magic PARE, which takes a key kiln has none of) is
// bounded and walked as a struct, its meaning not followed.
func checkParquetFooter(r io.ReaderAt, size int64) (tail []byte, err error) {
	if size < 8 {
		return nil, nil
	}
	var end [8]byte
	if _, err := r.ReadAt(end[:], size-8); err != nil {
		return nil, err
	}
	magic := string(end[4:])
	if magic != "PAR1" && magic != "PARE" {
		return nil, nil
	}
	// The file starts with a magic too: the footer can take at most what
	// lies between the two.
	n := int64(binary.LittleEndian.Uint32(end[:4]))
	if n > size-12 {
		return nil, corruptFooter("a footer of %d bytes in a file of %d", n, size)
	}
	tail = make([]byte, n+8)
	if _, err := r.ReadAt(tail[:n], size-8-n); err != nil {
		return nil, err
	}
	copy(tail[n:], end[:])
	w := footerWalk{b: tail[:n]}
	if magic == "PARE" {
		return tail, w.structValue(1)
	}
	if err := w.fileMetaData(); err != nil {
		return nil, err
	}
	return tail, w.check()
}

// footerCache is a file whose tail (footer, its length, the magic)
// checkParquetFooter has read: the library's reads within it are served
// from memory, so that a hub file's footer costs no second request.
type footerCache struct {
	io.ReaderAt
	off  int64
	tail []byte
}

func (c *footerCache) ReadAt(p []byte, off int64) (int, error) {
	if tail := c.tail; off >= c.off && off-c.off+int64(len(p)) <= int64(len(tail)) {
		return copy(p, tail[off-c.off:]), nil
	}
	return c.ReaderAt.ReadAt(p, off)
}

// The compact protocol's types.
const (
	ctStop   = 0
	ctTrue   = 1
	ctFalse  = 2
	ctByte   = 3
	ctI16    = 4
	ctI32    = 5
	ctI64    = 6
	ctDouble = 7
	ctBinary = 8
	ctList   = 9
	ctSet    = 10
	ctMap    = 11
	ctStruct = 12
	ctUUID   = 13
)

// footerWalk reads a FileMetaData's encoding as the library's decoder
// does (a struct ends at a field whose type is STOP, a field's id is the
// last one's plus its delta, a bool field has no bytes of its own, a bool
// element one), checking each count before anything could be sized by it.
// Of the footer's meaning it keeps what the library sizes the file's
// columns by.
type footerWalk struct {
	b   []byte
	off int

	// The schema: its elements, its leaves (elements with a type, the
	// columns the row groups must hold a chunk of), and the open groups
	// of the element being read, each with the children it still has to
	// come, as the library walks it.
	elements, leaves int
	open             [maxSchemaDepth]int32
	depth            int

	// The row groups: how many, their fewest and most column chunks, and
	// their rows added up.
	rowGroups              int
	minColumns, maxColumns int
	rows                   int64
}

func (w *footerWalk) left() int { return len(w.b) - w.off }

func (w *footerWalk) byte1() (byte, error) {
	if w.off >= len(w.b) {
		return 0, corruptFooter("it ends part way through a value")
	}
	c := w.b[w.off]
	w.off++
	return c, nil
}

func (w *footerWalk) uvarint() (uint64, error) {
	v, n := binary.Uvarint(w.b[w.off:])
	switch {
	case n == 0:
		return 0, corruptFooter("it ends part way through a number")
	case n < 0:
		return 0, corruptFooter("a number longer than 64 bits")
	}
	w.off += n
	return v, nil
}

func (w *footerWalk) varint() (int64, error) {
	u, err := w.uvarint()
	return int64(u>>1) ^ -int64(u&1), err
}

// int32v reads an i32 the library keeps, refusing one out of its range
// as the library's decoder does.
func (w *footerWalk) int32v() (int32, error) {
	v, err := w.varint()
	if err == nil && (v < math.MinInt32 || v > math.MaxInt32) {
		err = corruptFooter("a 32-bit number of %d", v)
	}
	return int32(v), err
}

func (w *footerWalk) skipBytes(n uint64) error {
	if n > uint64(w.left()) {
		return corruptFooter("a string of %d bytes in %d bytes", n, w.left())
	}
	w.off += int(n)
	return nil
}

// field reads a struct's field header; ok is false at the struct's end.
func (w *footerWalk) field(last int16) (id int16, typ byte, ok bool, err error) {
	c, err := w.byte1()
	if err != nil {
		return 0, 0, false, err
	}
	typ = c & 0x0f
	if typ == ctStop {
		return 0, 0, false, nil
	}
	if delta := c >> 4; delta != 0 {
		return last + int16(delta), typ, true, nil
	}
	v, err := w.varint()
	if err == nil && (v < math.MinInt16 || v > math.MaxInt16) {
		err = corruptFooter("a field id of %d", v)
	}
	return int16(v), typ, true, err
}

// list reads a list's (or a set's) header and checks that its elements
// could be there: each takes a byte at least.
func (w *footerWalk) list() (n int, elem byte, err error) {
	c, err := w.byte1()
	if err != nil {
		return 0, 0, err
	}
	size, elem := uint64(c>>4), c&0x0f
	if size == 15 {
		if size, err = w.uvarint(); err != nil {
			return 0, 0, err
		}
	}
	if size > uint64(w.left()) {
		return 0, 0, corruptFooter("a list of %d elements in %d bytes", size, w.left())
	}
	if size > 0 && !knownType(elem) {
		return 0, 0, corruptFooter("a list of values of unknown type %d", elem)
	}
	return int(size), elem, nil
}

func knownType(t byte) bool { return t >= ctTrue && t <= ctUUID }

// value walks one value of type t, at the given nesting. elem says it is
// a container's element, where a bool takes a byte (a field's is in its
// header).
func (w *footerWalk) value(t byte, elem bool, nest int) error {
	if nest > footerNesting {
		return corruptFooter("values nested more than %d deep", footerNesting)
	}
	switch t {
	case ctTrue, ctFalse:
		if elem {
			_, err := w.byte1()
			return err
		}
		return nil
	case ctByte:
		_, err := w.byte1()
		return err
	case ctI16, ctI32, ctI64:
		_, err := w.uvarint()
		return err
	case ctDouble:
		return w.skipFixed(8)
	case ctUUID:
		return w.skipFixed(16)
	case ctBinary:
		n, err := w.uvarint()
		if err != nil {
			return err
		}
		return w.skipBytes(n)
	case ctList, ctSet:
		n, et, err := w.list()
		if err != nil {
			return err
		}
		for range n {
			if err := w.value(et, true, nest+1); err != nil {
				return err
			}
		}
		return nil
	case ctMap:
		return w.mapValue(nest)
	case ctStruct:
		return w.structValue(nest)
	}
	return corruptFooter("a value of unknown type %d", t)
}

func (w *footerWalk) skipFixed(n int) error {
	if n > w.left() {
		return corruptFooter("it ends part way through a value")
	}
	w.off += n
	return nil
}

func (w *footerWalk) mapValue(nest int) error {
	size, err := w.uvarint()
	if err != nil || size == 0 {
		return err
	}
	c, err := w.byte1()
	if err != nil {
		return err
	}
	// An entry is a key and a value, a byte each at least.
	if size > uint64(w.left())/2 {
		return corruptFooter("a map of %d entries in %d bytes", size, w.left())
	}
	kt, vt := c>>4, c&0x0f
	if !knownType(kt) || !knownType(vt) {
		return corruptFooter("a map of values of unknown type %d to %d", kt, vt)
	}
	for range size {
		if err := w.value(kt, true, nest+1); err != nil {
			return err
		}
		if err := w.value(vt, true, nest+1); err != nil {
			return err
		}
	}
	return nil
}

// fields walks a struct's fields up to its stop, each with walk, given
// its id and type.
func (w *footerWalk) fields(walk func(id int16, t byte) error) error {
	var last int16
	for {
		id, t, ok, err := w.field(last)
		if err != nil || !ok {
			return err
		}
		if err := walk(id, t); err != nil {
			return err
		}
		last = id
	}
}

// structValue walks a struct none of whose fields the library sizes
// anything by.
func (w *footerWalk) structValue(nest int) error {
	return w.fields(func(_ int16, t byte) error { return w.value(t, false, nest+1) })
}

// fileMetaData walks the footer's FileMetaData: the schema is field 2 and
// the row groups field 4, each a list of structs.
func (w *footerWalk) fileMetaData() error {
	var schema, rowGroups bool
	return w.fields(func(id int16, t byte) error {
		switch {
		case id == 2 && t == ctList:
			return w.structs(&schema, "schema", w.schemaElement)
		case id == 4 && t == ctList:
			return w.structs(&rowGroups, "row groups", w.rowGroup)
		}
		return w.value(t, false, 1)
	})
}

// structs walks a list field that the library decodes into a slice of
// structs, each element with walk. A second such field would be decoded
// over the first, keeping some of its elements: no writer repeats a
// field, and the counts kept here would no longer be the library's.
func (w *footerWalk) structs(seen *bool, name string, walk func() error) error {
	if *seen {
		return corruptFooter("its %s given twice", name)
	}
	*seen = true
	n, et, err := w.list()
	if err != nil {
		return err
	}
	for range n {
		if et != ctStruct {
			// The library skips elements of another type.
			err = w.value(et, true, 2)
		} else {
			err = walk()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// schemaElement walks one SchemaElement, whose type (field 1) makes it a
// leaf and whose num_children (field 5) opens a group, and follows the
// schema's nesting as the library does to size the columns' paths.
func (w *footerWalk) schemaElement() error {
	var typed bool
	var children int32
	err := w.fields(func(id int16, t byte) (err error) {
		switch {
		case id == 1 && t == ctI32:
			typed = true
			_, err = w.int32v()
		case id == 5 && t == ctI32:
			children, err = w.int32v()
		default:
			err = w.value(t, false, 3)
		}
		return err
	})
	if err != nil {
		return err
	}
	w.elements++
	if typed {
		w.leaves++
	}
	if children > 0 {
		if w.depth == maxSchemaDepth {
			return corruptFooter("a schema nested more than %d levels deep", maxSchemaDepth)
		}
		w.open[w.depth] = children
		w.depth++
		return nil
	}
	// A leaf closes itself and the groups whose last child it was.
	for w.depth > 0 {
		w.open[w.depth-1]--
		if w.open[w.depth-1] > 0 {
			break
		}
		w.depth--
	}
	return nil
}

// rowGroup walks one RowGroup: its column chunks are field 1, its rows
// field 3.
func (w *footerWalk) rowGroup() error {
	var listed bool
	columns := 0
	err := w.fields(func(id int16, t byte) (err error) {
		switch {
		case id == 1 && t == ctList:
			if listed {
				return corruptFooter("a row group's columns given twice")
			}
			listed = true
			var et byte
			if columns, et, err = w.list(); err == nil {
				for range columns {
					if err = w.value(et, true, 3); err != nil {
						break
					}
				}
				if et != ctStruct {
					columns = 0 // skipped by the library
				}
			}
		case id == 3 && t == ctI64:
			var n int64
			if n, err = w.varint(); err == nil && n > 0 {
				if w.rows > math.MaxInt64-n {
					return corruptFooter("row groups whose rows add up past 2^63")
				}
				w.rows += n
			}
		default:
			err = w.value(t, false, 3)
		}
		return err
	})
	if err != nil {
		return err
	}
	if w.rowGroups == 0 || columns < w.minColumns {
		w.minColumns = columns
	}
	w.maxColumns = max(w.maxColumns, columns)
	w.rowGroups++
	return nil
}

// check compares what the walk kept: the library allocates a chunk for
// every column of every row group, the schema's columns times the row
// groups, before it checks that each row group holds that many. In a
// file it can read they are equal.
func (w *footerWalk) check() error {
	if w.rowGroups == 0 {
		return nil
	}
	if w.minColumns != w.leaves || w.maxColumns != w.leaves {
		n := w.minColumns
		if n == w.leaves {
			n = w.maxColumns
		}
		return corruptFooter("a row group of %d column chunks for a schema of %d columns", n, w.leaves)
	}
	return nil
}
