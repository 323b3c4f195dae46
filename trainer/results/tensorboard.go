package results

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// TensorBoard reads a run's scalars from event files: TFRecord frames
// (length, masked CRC-32C of the length, an Event protobuf, its masked
// CRC-32C), the first Event naming the file version, then one Event per
// logged step holding a Summary of tagged scalar values. kiln writes one
// file per training segment, from the segment's lines of metrics.jsonl, so
// the steps continue across resumes as the metrics do.

// TensorBoardDir is the results subdirectory (and object prefix) that
// holds a run's event files: `tensorboard --logdir` reads it.
const TensorBoardDir = "tensorboard"

// The scalars' tags. TensorBoard groups tags by the part before the slash.
const (
	TagLoss       = "train/loss"
	TagLR         = "train/lr"
	TagGradNorm   = "train/grad_norm"
	TagEvalLoss   = "eval/loss"
	TagAuxLoss    = "train/aux_loss"
	TagTokPerSec  = "perf/tok_per_s"
	TagMFU        = "perf/mfu"
	TagPeakMemory = "perf/peak_memory_gib"
)

// EventFileName is the name of a segment's event file: TensorBoard reads
// files whose name holds "tfevents", in the order of the time in it.
func EventFileName(began time.Time, host string, firstStep int) string {
	return fmt.Sprintf("events.out.tfevents.%d.%s.step%d", began.Unix(), host, firstStep)
}

// ParseEventFileName reads what EventFileName put into name: the
// segment's start (to the second), its host and its first step. ok is
// false for any other name (a file being written, ending ".tmp").
func ParseEventFileName(name string) (began time.Time, host string, firstStep int, ok bool) {
	rest, found := strings.CutPrefix(name, "events.out.tfevents.")
	if !found {
		return time.Time{}, "", 0, false
	}
	secs, rest, found := strings.Cut(rest, ".")
	i := strings.LastIndex(rest, ".step")
	if !found || i < 0 {
		return time.Time{}, "", 0, false
	}
	sec, err1 := strconv.ParseInt(secs, 10, 64)
	step, err2 := strconv.Atoi(rest[i+len(".step"):])
	if err1 != nil || err2 != nil || step < 0 || i == 0 {
		return time.Time{}, "", 0, false
	}
	return time.Unix(sec, 0), rest[:i], step, true
}

// EventFile is an event file as its name says: the stretch of training
// that began at Began, after step From.
type EventFile struct {
	Name  string
	Began time.Time
	From  int
}

// StretchEnd is the last step of f's stretch, one of files, when the run
// is at step: where the next stretch begins (a later first step, or the
// same first step begun later: a resume from the same checkpoint trained
// those steps again; begun in the same second, the later name), so that
// no step is in two files; step when none begins after it. A stretch that
// ends where it begins holds no step.
func StretchEnd(files []EventFile, f EventFile, step int) int {
	end := step
	for _, g := range files {
		if g.From > f.From || (g.From == f.From && (g.Began.After(f.Began) || (g.Began.Equal(f.Began) && g.Name > f.Name))) {
			end = min(end, g.From)
		}
	}
	return end
}

// FirstStretch is the event file of the run's first stretch where none of
// files holds it: recs has lines up to the first step of the earliest
// file, and no file begins at step 0. A process killed after its first
// checkpoint and before that stretch's file was written (a segment's is
// written once the checkpoint's upload ends, so a kill during the upload)
// leaves it so, and every later file begins after it. The file's time is
// a second before the earliest file's, less the stretch's own elapsed
// seconds, so that TensorBoard, which reads a directory's files in the
// order of their names, reads it first; its name, given the earliest file,
// is the same at each call of a host. ok is false where files is empty or
// the run's first stretch is in one.
func FirstStretch(files []EventFile, recs []Record) (EventFile, bool) {
	if len(files) == 0 {
		return EventFile{}, false
	}
	first := files[0]
	for _, f := range files[1:] {
		if f.From < first.From || (f.From == first.From && f.Began.Before(first.Began)) {
			first = f
		}
	}
	if first.From == 0 {
		return EventFile{}, false
	}
	elapsed, found := 0.0, false
	for _, r := range recs {
		if r.Step <= first.From {
			elapsed, found = max(elapsed, r.ElapsedS), true
		}
	}
	if !found {
		return EventFile{}, false
	}
	began := time.Unix(first.Began.Unix()-int64(math.Ceil(elapsed))-1, 0)
	host, _ := os.Hostname()
	return EventFile{Name: EventFileName(began, host, 0), Began: began, From: 0}, true
}

// WriteEventFile writes the event file of one stretch of training into
// dir/tensorboard: the lines of recs after step from (a fresh run's step 0
// evaluation too) up to step to, which began at began. It returns the
// file's path relative to dir, with slashes, or "" when the stretch logged
// nothing. The file is written whole or not at all.
func WriteEventFile(dir string, recs []Record, from, to int, began time.Time) (string, error) {
	if began.IsZero() {
		return "", nil
	}
	var buf bytes.Buffer
	if n, err := WriteEventStretch(&buf, recs, from, to, began); err != nil || n == 0 {
		return "", err
	}
	host, _ := os.Hostname()
	name := TensorBoardDir + "/" + EventFileName(began, host, from)
	path := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("event file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("event file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("event file: %w", err)
	}
	return name, nil
}

// WriteEventStretch writes to w the event file of the lines of recs after
// step from (a fresh run's step 0 evaluation too) up to step to, which
// began at began, and returns how many lines it holds; with none it
// writes nothing. A stretch that trained no step (to at or before from)
// holds none, not even step 0's evaluation: the stretch that trains step
// 1 has that.
func WriteEventStretch(w io.Writer, recs []Record, from, to int, began time.Time) (int, error) {
	if to <= from {
		return 0, nil
	}
	var seg []Record
	for _, r := range recs {
		if r.Step <= to && (r.Step > from || (from == 0 && r.Step == 0)) {
			seg = append(seg, r)
		}
	}
	if len(seg) == 0 {
		return 0, nil
	}
	return len(seg), WriteEvents(w, seg, began)
}

// WriteEvents writes recs as one event file to w. Each record's wall time
// is began plus its elapsed_s (a segment's lines count from its start).
func WriteEvents(w io.Writer, recs []Record, began time.Time) error {
	base := float64(began.UnixNano()) / 1e9
	var ev []byte
	ev = protowire.AppendTag(ev, 1, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(base))
	ev = protowire.AppendTag(ev, 3, protowire.BytesType)
	ev = protowire.AppendString(ev, "brain.Event:2")
	if err := writeRecord(w, ev); err != nil {
		return err
	}
	for _, r := range recs {
		vals := scalars(r)
		if len(vals) == 0 {
			continue
		}
		var sum []byte
		for _, v := range vals {
			var val []byte
			val = protowire.AppendTag(val, 1, protowire.BytesType)
			val = protowire.AppendString(val, v.tag)
			val = protowire.AppendTag(val, 2, protowire.Fixed32Type)
			val = protowire.AppendFixed32(val, math.Float32bits(float32(v.value)))
			sum = protowire.AppendTag(sum, 1, protowire.BytesType)
			sum = protowire.AppendBytes(sum, val)
		}
		ev = ev[:0]
		ev = protowire.AppendTag(ev, 1, protowire.Fixed64Type)
		ev = protowire.AppendFixed64(ev, math.Float64bits(base+r.ElapsedS))
		ev = protowire.AppendTag(ev, 2, protowire.VarintType)
		ev = protowire.AppendVarint(ev, uint64(r.Step))
		ev = protowire.AppendTag(ev, 5, protowire.BytesType)
		ev = protowire.AppendBytes(ev, sum)
		if err := writeRecord(w, ev); err != nil {
			return err
		}
	}
	return nil
}

type scalar struct {
	tag   string
	value float64
}

// scalars are the values of one metrics line that TensorBoard plots.
func scalars(r Record) []scalar {
	var out []scalar
	if r.Loss != nil {
		out = append(out, scalar{TagLoss, *r.Loss}, scalar{TagLR, r.LR}, scalar{TagGradNorm, r.GradNorm})
		if r.TokPerSec > 0 {
			out = append(out, scalar{TagTokPerSec, r.TokPerSec})
		}
		if r.MFU != nil {
			out = append(out, scalar{TagMFU, *r.MFU})
		}
		if r.PeakMemory > 0 {
			out = append(out, scalar{TagPeakMemory, float64(r.PeakMemory) / (1 << 30)})
		}
		if r.AuxLoss != nil {
			out = append(out, scalar{TagAuxLoss, *r.AuxLoss})
		}
	}
	if r.EvalLoss != nil {
		out = append(out, scalar{TagEvalLoss, *r.EvalLoss})
	}
	for _, store := range slices.Sorted(maps.Keys(r.EvalLossByStore)) {
		out = append(out, scalar{TagEvalLoss + "/" + store, r.EvalLossByStore[store]})
	}
	return out
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maskedCRC is TFRecord's checksum: CRC-32C rotated and offset, so that a
// CRC of data holding CRCs does not degenerate.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

func writeRecord(w io.Writer, data []byte) error {
	var buf bytes.Buffer
	var hdr [12]byte
	binary.LittleEndian.PutUint64(hdr[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(hdr[8:], maskedCRC(hdr[:8]))
	buf.Write(hdr[:])
	buf.Write(data)
	var foot [4]byte
	binary.LittleEndian.PutUint32(foot[:], maskedCRC(data))
	buf.Write(foot[:])
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write event file: %w", err)
	}
	return nil
}
