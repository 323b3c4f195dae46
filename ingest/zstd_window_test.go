package ingest

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// zstdFrame is a zstd frame (RFC 8878, 3.1.1) of one raw block holding
// content, its header declaring the window windowLog says (Window_Descriptor
// 3.1.1.1.2: its exponent is windowLog-10, its mantissa 0), or, where
// windowLog is 0, a single segment whose window is the frame's content size
// fcs. A decoder of that much memory reads it; zstd --long=31 writes such a
// header, of a 2 GiB window, where it compresses a stream.
func zstdFrame(windowLog int, fcs uint32, content []byte) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd}
	if windowLog > 0 {
		b = append(b, 0x00, byte(windowLog-10)<<3) // no content size, checksum or dictionary
	} else {
		b = append(b, 0x80|0x20) // single segment, a 4-byte content size
		b = binary.LittleEndian.AppendUint32(b, fcs)
	}
	// Last_Block 1, Block_Type 0 (raw), Block_Size.
	h := uint32(1 | len(content)<<3)
	b = append(b, byte(h), byte(h>>8), byte(h>>16))
	return append(b, content...)
}

// A zstd file whose frame declares a window over the 512 MiB the decoder
// holds (zstd --long=31: 2 GiB) is skipped for that, as zstd-window, with
// a message that names the window, the limit and how to recompress it:
// it was skipped as a corrupt file, which it is not. A window of 512 MiB
// (--long=29) is read.
func TestAZstdFileOfATooLargeWindowIsSkippedForIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	line := []byte(`{"text":"package main"}` + "\n")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, window string
		frame        []byte
	}{
		{"long31.jsonl.zst", "2.0 GiB", zstdFrame(31, 0, line)},
		{"long30.txt.zst", "1.0 GiB", zstdFrame(30, 0, []byte("package main\n"))},
		{"segment.jsonl.zst", "1.0 GiB", zstdFrame(0, 1<<30, line)},
	} {
		_, _, err := readAll(t, write(c.name, c.frame), OpenOptions{})
		var skip *SkipError
		if !errors.As(err, &skip) || skip.Reason != SkipZstdWindow {
			t.Errorf("%s: %v; want it skipped as %s", c.name, err, SkipZstdWindow)
			continue
		}
		for _, w := range []string{"a window of " + c.window, "over the 512.0 MiB", "recompress it with --long=29 or less"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want it to say %q", c.name, err, w)
			}
		}
	}
	docs, skips, err := readAll(t, write("long29.jsonl.zst", zstdFrame(29, 0, line)), OpenOptions{})
	if err != nil || len(docs) != 1 || docs[0].Text != "package main" || len(skips) != 0 {
		t.Fatalf("a frame of a 512 MiB window: %v, %v, %v; want its document", docs, skips, err)
	}

	// An ingest counts the file under its reason, and the store records
	// it so.
	if err := os.MkdirAll(filepath.Join(dir, "in", "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "in", "src", "f.jsonl.zst"), zstdFrame(31, 0, line), 0o644); err != nil {
		t.Fatal(err)
	}
	opt := skipsDirect(t, filepath.Join(dir, "in"), nil)
	opt.Preset.Glob = filepath.Join(dir, "in", "src", "*.jsonl.zst")
	opt.Preset.Name = LocalPrefix + opt.Preset.Glob
	rep, err := Direct(context.Background(), opt)
	if err != nil || rep.SkippedFiles[SkipZstdWindow] != 1 || !strings.Contains(rep.FirstSkipped, "a window of 2.0 GiB") {
		t.Fatalf("an ingest of the file: %+v, %v; want it skipped as %s", rep, err, SkipZstdWindow)
	}
}
