package ingest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/internal/bytesize"
)

// A shard whose tokens fill the disk under a direct ingest's shards says
// how much of it had been written when the disk filled, and that its
// partial file is gone: the room free after that is the partial file's,
// where the message showed it alone and the disk looked nearly empty.
func TestAShardThatFillsTheDiskSaysHowMuchItHadWritten(t *testing.T) {
	t.Parallel()
	const size = 64 << 10
	disk := smallDisk(t, size)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Compressed, the file is a few KiB; its tokens are far more than the
	// disk holds.
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	for d := range 8000 {
		fmt.Fprintf(zw, `{"text":"doc %d: func main() { fmt.Println(\"hello, world\") }"}`+"\n", d)
	}
	zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "src", "f.jsonl.zst"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	opt := skipsDirect(t, dir, nil)
	opt.Preset.Glob = filepath.Join(dir, "src", "*.jsonl.zst")
	opt.Preset.Name = LocalPrefix + opt.Preset.Glob
	opt.DataDir = disk
	_, err := Direct(context.Background(), opt)
	if err == nil {
		t.Fatal("a shard larger than its disk was made without an error")
	}
	m := regexp.MustCompile(`for the shard of \S+: the disk filled once at least (.+?) of it had been written, so it needs more room than that \(free there: (.+?), with its partial file since removed\)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("a shard that fills its disk: %v; want how much of it had been written, and that its partial file is removed", err)
	}
	written, err := bytesize.Parse(m[1])
	if err != nil || written <= 0 || written > size {
		t.Fatalf("the shard had written %q (%d) of a %d KiB disk when it filled: %v", m[1], written, size>>10, err)
	}
	if free, err := bytesize.Parse(m[2]); err != nil || free > size {
		t.Fatalf("free there: %q (%d, %v)", m[2], free, err)
	}
}
