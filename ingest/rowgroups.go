package ingest

import (
	"context"
	"io"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sync/semaphore"
)

// segmentBytes is the text a row-group decoder hands over at a time: the
// size of WriteShard's chunks, so a segment's documents usually feed one
// encoder.
const segmentBytes = chunkBytes

// DefaultDecodeAhead is the text that a parquet file's decoders may hold
// ahead of the row group being read, unless OpenOptions says otherwise:
// 4 MiB per core, at most 64 MiB. Decoding ahead costs the encoders their
// caches (the tokenizer's maps) as the text streams through memory: with
// 64 MiB ahead on the 2-vCPU VM, a run through the queue spent 8% more CPU
// in the tokenizer's map lookups and was 15% slower than with one reader,
// while 8 MiB cost nothing measurable (docs/benchmarks/ingest.md). Running
// ahead pays only where one reader cannot feed the cores: on 16 cores the
// encoders of a file take about 3 of the benchmark's 32 MiB row groups in
// the time one decoder reads one.
func DefaultDecodeAhead() int64 { return min(int64(runtime.GOMAXPROCS(0))<<22, 64<<20) }

// rowGroupSource is the documents of a parquet file's text column, its row
// groups decoded on several goroutines (pages read, decompressed, checked
// and copied out) and handed over in file order: the documents, their ids
// and the skip counts are those of reading the file on one goroutine, so a
// shard's bytes do not depend on the number of cores. One file can then
// feed every encoder of a machine, where a single reader was bounded near
// 90 MB/s (docs/benchmarks/ingest.md).
//
// Memory is bounded whatever the file's size: decoders take row groups in
// order, and a decoder working ahead of the group being read must reserve
// each segment's bytes from a shared budget (OpenOptions.DecodeAhead); the
// group being read needs no reservation (so the reader can never wait on a
// budget held by groups behind it), and its queue holds at most the budget
// again. A file's decoded text is then at most twice the budget, plus a
// segment per decoder, whatever the size of the file or of its row groups.
type rowGroupSource struct {
	r        *parquetReader
	decoders int
	// segment is segmentBytes, ahead the budget; tests shrink them.
	segment, ahead int64

	started bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	groups  chan *decodedGroup // in file order
	budget  *semaphore.Weighted

	cur   *decodedGroup
	seg   *docSegment
	i     int
	skips Skips
	// from is the first row read (OpenOptions.From): the row groups
	// before it are not decoded at all.
	from int64
	log  skipLog
}

// decodedGroup is one row group on its way to the reader.
type decodedGroup struct {
	index int
	base  int64            // row number of the group's first row in the file
	segs  chan *docSegment // closed after the last segment, or at err
	err   error            // set before segs is closed
	ahead context.Context  // canceled once the reader has reached the group
	reach context.CancelFunc
}

// docSegment is consecutive checked documents of one row group.
type docSegment struct {
	docs   []Document
	skips  Skips   // nil when none
	log    skipLog // where they are
	credit int64   // bytes reserved from the budget, released once read
}

func newRowGroupSource(r *parquetReader, ahead, from int64) *rowGroupSource {
	if ahead <= 0 {
		ahead = DefaultDecodeAhead()
	}
	return &rowGroupSource{r: r, decoders: max(1, min(runtime.GOMAXPROCS(0), len(r.pf.RowGroups()))),
		segment: segmentBytes, ahead: ahead, skips: Skips{}, from: from}
}

// start launches the decoders: one goroutine queues the row groups in
// order (at most decoders ahead of the reader), and each decoder decodes
// the next queued group.
func (s *rowGroupSource) start(ctx context.Context) {
	s.started = true
	ctx, s.cancel = context.WithCancel(ctx)
	s.budget = semaphore.NewWeighted(s.ahead)
	s.groups = make(chan *decodedGroup, s.decoders)
	work := make(chan *decodedGroup)
	s.wg.Add(1 + s.decoders)
	go func() {
		defer s.wg.Done()
		defer close(work)
		defer close(s.groups)
		var base int64
		for i, g := range s.r.pf.RowGroups() {
			if base+g.NumRows() <= s.from {
				base += g.NumRows()
				continue
			}
			ahead, reach := context.WithCancel(ctx)
			dg := &decodedGroup{index: i, base: base, segs: make(chan *docSegment, max(1, s.ahead/s.segment)), ahead: ahead, reach: reach}
			base += g.NumRows()
			select {
			case s.groups <- dg:
			case <-ctx.Done():
				reach()
				return
			}
			select {
			case work <- dg:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range s.decoders {
		go func() {
			defer s.wg.Done()
			for dg := range work {
				dg.err = s.decode(ctx, dg)
				close(dg.segs)
			}
		}()
	}
}

// decode reads one row group into segments.
func (s *rowGroupSource) decode(ctx context.Context, dg *decodedGroup) error {
	gr := s.r.cursor(dg.index, dg.base)
	defer gr.closePages()
	if err := gr.openRowGroup(ctx); err != nil {
		return err
	}
	seg, size := &docSegment{}, int64(0)
	var arena []byte
	send := func() error {
		n := min(size, s.ahead)
		if dg.ahead.Err() == nil {
			if err := s.budget.Acquire(dg.ahead, n); err == nil {
				seg.credit = n
			} else if err := ctx.Err(); err != nil {
				return err
			}
			// Otherwise the reader reached the group while the decoder
			// waited: its segments need no reservation.
		}
		select {
		case dg.segs <- seg:
		case <-ctx.Done():
			s.budget.Release(seg.credit)
			return ctx.Err()
		}
		seg, size, arena = &docSegment{}, 0, nil
		return nil
	}
	for gr.pos < gr.rows {
		row := gr.base + gr.pos
		rec, err := gr.next(ctx)
		if err != nil {
			return err
		}
		if row < s.from {
			continue
		}
		if reason := recordSkip(rec); reason != "" {
			if seg.skips == nil {
				seg.skips = Skips{}
			}
			seg.skips.Add(reason, 1)
			seg.log.add(row, reason)
			continue
		}
		var text string
		text, arena = copyText(arena, rec.text, s.segment-size)
		seg.docs = append(seg.docs, Document{ID: rec.id, Text: text})
		if size += int64(len(rec.text)); size >= s.segment {
			if err := send(); err != nil {
				return err
			}
		}
		if gr.pos&255 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	if len(seg.docs) > 0 || seg.skips != nil {
		return send()
	}
	return nil
}

// copyText copies a document's text out of its page (whose buffer the
// page's release reuses) into arena, a block of one segment's documents
// that is only ever appended to, so that the strings made over it never
// change: one allocation per segment instead of one per document. room is
// what the segment still takes before it is sent; the document that fills
// it, and any that does not fit, gets a string of its own, so a block
// holds one segment's documents and no more. It returns the text and the
// arena to copy the next one into.
func copyText(arena, text []byte, room int64) (string, []byte) {
	if len(text) == 0 {
		return "", arena
	}
	if int64(len(text)) >= room {
		return string(text), arena
	}
	if arena == nil {
		arena = make([]byte, 0, room)
	}
	if cap(arena)-len(arena) < len(text) {
		return string(text), arena
	}
	n := len(arena)
	arena = append(arena, text...)
	return unsafe.String(&arena[n], len(text)), arena
}

func (s *rowGroupSource) Next(ctx context.Context) (Document, error) {
	if !s.started {
		s.start(ctx)
	}
	for {
		if s.seg != nil && s.i < len(s.seg.docs) {
			d := s.seg.docs[s.i]
			s.seg.docs[s.i] = Document{}
			s.i++
			return d, nil
		}
		if s.seg != nil {
			s.budget.Release(s.seg.credit)
			s.seg = nil
		}
		if err := ctx.Err(); err != nil {
			return Document{}, err
		}
		if s.cur == nil {
			select {
			case dg, ok := <-s.groups:
				if !ok {
					return Document{}, io.EOF
				}
				s.cur = dg
				dg.reach()
			case <-ctx.Done():
				return Document{}, ctx.Err()
			}
		}
		select {
		case seg, ok := <-s.cur.segs:
			if !ok {
				if err := s.cur.err; err != nil {
					return Document{}, err
				}
				s.cur = nil
				continue
			}
			s.skips.Merge(seg.skips)
			s.log.merge(seg.log)
			s.seg, s.i = seg, 0
		case <-ctx.Done():
			return Document{}, ctx.Err()
		}
	}
}

func (s *rowGroupSource) Skipped() Skips       { return s.skips }
func (s *rowGroupSource) SkippedAt() []SkipRun { return s.log }

// Close stops the decoders, waits for them, and closes the file.
func (s *rowGroupSource) Close() error {
	if s.started {
		s.cancel()
		s.wg.Wait()
	}
	return s.r.Close()
}

// recordSkip is textSource's check of one record: the reason to skip it,
// or "".
func recordSkip(rec record) string {
	switch {
	case rec.skip != "":
		return rec.skip
	case rec.null:
		return SkipEmptyDocument
	}
	return checkText(rec.text)
}

var _ Source = (*rowGroupSource)(nil)
