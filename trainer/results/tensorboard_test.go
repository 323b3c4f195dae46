package results

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"math"
	"testing"
	"time"
)

// event is what a reader of TensorBoard's format finds in one record.
type event struct {
	wall    float64
	step    int64
	version string
	values  map[string]float32
}

// readEvents decodes an event file the way TensorBoard's reader does,
// written here from the format's definition (TFRecord framing, the Event
// and Summary protobuf messages) and sharing no code with the writer.
func readEvents(t *testing.T, b []byte) []event {
	t.Helper()
	table := crc32.MakeTable(crc32.Castagnoli)
	unmask := func(m uint32) uint32 {
		c := m - 0xa282ead8
		return c<<15 | c>>17
	}
	var out []event
	for len(b) > 0 {
		if len(b) < 12 {
			t.Fatalf("truncated record header: %d bytes left", len(b))
		}
		n := binary.LittleEndian.Uint64(b[:8])
		if got := crc32.Checksum(b[:8], table); unmask(binary.LittleEndian.Uint32(b[8:12])) != got {
			t.Fatal("length CRC mismatch")
		}
		data := b[12 : 12+n]
		if got := crc32.Checksum(data, table); unmask(binary.LittleEndian.Uint32(b[12+n:16+n])) != got {
			t.Fatal("data CRC mismatch")
		}
		b = b[16+n:]
		out = append(out, parseEvent(t, data))
	}
	return out
}

// field walks one protobuf message: each call returns the next field's
// number, wire type, varint value or raw bytes.
func fields(t *testing.T, b []byte, fn func(num int, typ int, v uint64, raw []byte)) {
	t.Helper()
	uvarint := func() uint64 {
		x, n := binary.Uvarint(b)
		if n <= 0 {
			t.Fatal("bad varint")
		}
		b = b[n:]
		return x
	}
	for len(b) > 0 {
		key := uvarint()
		num, typ := int(key>>3), int(key&7)
		switch typ {
		case 0:
			fn(num, typ, uvarint(), nil)
		case 1:
			fn(num, typ, binary.LittleEndian.Uint64(b[:8]), b[:8])
			b = b[8:]
		case 2:
			l := uvarint()
			fn(num, typ, 0, b[:l])
			b = b[l:]
		case 5:
			fn(num, typ, uint64(binary.LittleEndian.Uint32(b[:4])), b[:4])
			b = b[4:]
		default:
			t.Fatalf("unexpected wire type %d", typ)
		}
	}
}

func parseEvent(t *testing.T, data []byte) event {
	e := event{values: map[string]float32{}}
	fields(t, data, func(num, typ int, v uint64, raw []byte) {
		switch num {
		case 1:
			e.wall = math.Float64frombits(v)
		case 2:
			e.step = int64(v)
		case 3:
			e.version = string(raw)
		case 5: // Summary
			fields(t, raw, func(num, typ int, v uint64, raw []byte) {
				if num != 1 {
					return
				}
				var tag string
				var val float32
				fields(t, raw, func(num, typ int, v uint64, raw []byte) {
					switch num {
					case 1:
						tag = string(raw)
					case 2:
						val = math.Float32frombits(uint32(v))
					}
				})
				e.values[tag] = val
			})
		}
	})
	return e
}

// Every scalar of every logged line comes back from the event file, at
// its step and wall time, behind the file-version event TensorBoard reads
// first.
func TestEventFilesHoldEveryScalar(t *testing.T) {
	began := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	recs := []Record{
		{Step: 0, EvalLoss: F(8.3)},
		{Step: 1, Tokens: 256, Loss: F(8.1), LR: 1e-4, GradNorm: 2.5, TokPerSec: 1500, ElapsedS: 0.5, PeakMemory: 3 << 30},
		{Step: 2, Tokens: 512, Loss: F(7.9), LR: 2e-4, GradNorm: 2.25, TokPerSec: 1600, MFU: F(0.31), EvalLoss: F(7.95), ElapsedS: 1.25, AuxLoss: F(2.5),
			EvalLossByStore: map[string]float64{"code": 7.5, "web": 8.25}},
	}
	var buf bytes.Buffer
	if err := WriteEvents(&buf, recs, began); err != nil {
		t.Fatal(err)
	}
	evs := readEvents(t, buf.Bytes())
	if len(evs) != 4 || evs[0].version != "brain.Event:2" || evs[0].wall != 1796126400 {
		t.Fatalf("events %+v; want the version event and three steps", evs)
	}
	want := []map[string]float32{
		{TagEvalLoss: 8.3},
		{TagLoss: 8.1, TagLR: 1e-4, TagGradNorm: 2.5, TagTokPerSec: 1500, TagPeakMemory: 3},
		{TagLoss: 7.9, TagLR: 2e-4, TagGradNorm: 2.25, TagTokPerSec: 1600, TagMFU: 0.31, TagEvalLoss: 7.95, TagAuxLoss: 2.5, "eval/loss/code": 7.5, "eval/loss/web": 8.25},
	}
	for i, e := range evs[1:] {
		if e.step != int64(recs[i].Step) || e.wall != 1796126400+recs[i].ElapsedS {
			t.Errorf("event %d: step %d wall %v; want step %d wall %v", i, e.step, e.wall, recs[i].Step, 1796126400+recs[i].ElapsedS)
		}
		if len(e.values) != len(want[i]) {
			t.Errorf("event %d: %d values %v; want %v", i, len(e.values), e.values, want[i])
		}
		for tag, v := range want[i] {
			if e.values[tag] != v {
				t.Errorf("event %d: %s = %v; want %v", i, tag, e.values[tag], v)
			}
		}
	}
	if n := EventFileName(began, "gpu-1", 5); n != "events.out.tfevents.1796126400.gpu-1.step5" {
		t.Errorf("file name %q", n)
	}
}
