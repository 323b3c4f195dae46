package ingest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/tokens"
)

// A direct ingest into a store on a disk that fills up, as it writes a
// shard's tokens or the manifest that commits them, stops naming the
// store's directory, the bytes the shard needed and those free; the store
// stays whole (its manifest matches its tokens, and it reads), and once
// there is room the same ingest adds the files left out, each once.
func TestADirectIngestOnAFullDiskSaysWhatItNeeds(t *testing.T) {
	t.Parallel()
	// A shard is 123 KiB of tokens: the second one's fills 192 KiB, and
	// 256 KiB leave it room but not its manifest.
	for _, size := range []int64{192 << 10, 256 << 10} {
		t.Run(fmt.Sprintf("%dKiB", size>>10), func(t *testing.T) { testFullDisk(t, size) })
	}
}

func testFullDisk(t *testing.T, size int64) {
	disk := testsvc.SmallDisk(t, size)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	const files = 8
	for f := range files {
		var b strings.Builder
		for d := range 2000 {
			fmt.Fprintf(&b, `{"text":"file %d doc %d: func main() { fmt.Println(\"hello, world\") }"}`+"\n", f, d)
		}
		if err := os.WriteFile(filepath.Join(dir, "src", fmt.Sprintf("f%d.jsonl", f)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	opt := skipsDirect(t, dir, nil)
	opt.StoreDir = filepath.Join(disk, "store")

	_, err := Direct(context.Background(), opt)
	if err == nil {
		t.Fatalf("the ingest filled a %d KiB disk without an error", size>>10)
	}
	if msg := err.Error(); !strings.Contains(msg, "no space left on the disk of "+opt.StoreDir+" for the ") ||
		!strings.Contains(msg, " bytes of tokens of ") || !strings.Contains(msg, " and a new copy of its manifest.json (") ||
		!strings.Contains(msg, "(free there: ") || !strings.Contains(msg, "run the ingest again") {
		t.Fatalf("the error does not name the store's directory, the room the shard needs and the room there is: %v", err)
	}
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || len(m.Shards) != 1 {
		t.Fatalf("the store on the full disk: %+v, %v", m, err)
	}
	st, err := tokens.Open(opt.StoreDir)
	if err != nil {
		t.Fatalf("the store on the full disk does not open: %v", err)
	}
	if err := st.Verify(context.Background()); err != nil || st.Len() != m.Tokens {
		t.Fatalf("the store on the full disk reads %d tokens, its manifest commits %d: %v", st.Len(), m.Tokens, err)
	}
	st.Close()

	if err := unix.Mount("tmpfs", disk, "tmpfs", unix.MS_REMOUNT, fmt.Sprintf("size=%d", 8<<20)); err != nil {
		t.Fatal(err)
	}
	rep, err := Direct(context.Background(), opt)
	if err != nil || rep.Duplicates != len(m.Shards) || rep.Appended != files-len(m.Shards) {
		t.Fatalf("the ingest again with room: %+v, %v", rep, err)
	}
	m2, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || len(m2.Shards) != files || m2.Documents != files*2000 {
		t.Fatalf("the store after the ingest again: %+v, %v", m2, err)
	}
	for i, s := range m.Shards {
		if m2.Shards[i] != s {
			t.Fatalf("shard %d changed: %+v, was %+v", i, m2.Shards[i], s)
		}
	}
	st, err = tokens.Open(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Verify(context.Background()); err != nil {
		t.Fatalf("the store after the ingest again: %v", err)
	}
}

// A disk that fills up as a shard's tokens are written for their append
// (a direct ingest's data directory; the queue's, with the local object
// store) stops the ingest naming that directory and what to do, as an
// append does, where it was the bare error of the write.
func TestAFullDiskUnderTheShardsSaysWhatToDo(t *testing.T) {
	t.Parallel()
	disk := testsvc.SmallDisk(t, 64<<10)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The file is compressed: the copy it is read from fits in the disk,
	// and its tokens do not.
	var b bytes.Buffer
	zw, _ := zstd.NewWriter(&b)
	for d := range 4000 {
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
	if err == nil || !strings.Contains(err.Error(), "no space left on the disk of "+disk) || !strings.Contains(err.Error(), "for the shard of ") ||
		!strings.Contains(err.Error(), "(free there: ") || !strings.Contains(err.Error(), "run the ingest again") {
		t.Fatalf("an ingest whose shards fill their disk: %v; want the directory, the shard and what to do named", err)
	}
	// How much of the shard had been written when the disk filled, and
	// that its partial file is gone: the room free after that is the
	// partial file's, where the message showed it alone and the disk
	// looked nearly empty.
	m := regexp.MustCompile(`for the shard of \S+: the disk filled once at least (.+?) of it had been written, so it needs more room than that \(free there: (.+?), with its partial file since removed\)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("a shard that fills its disk: %v; want how much of it had been written, and that its partial file is removed", err)
	}
	const size = 64 << 10
	if written, err := bytesize.Parse(m[1]); err != nil || written <= 0 || written > size {
		t.Fatalf("the shard had written %q (%d) of a %d KiB disk when it filled: %v", m[1], written, size>>10, err)
	}
	if free, err := bytesize.Parse(m[2]); err != nil || free > size {
		t.Fatalf("free there: %q (%d, %v)", m[2], free, err)
	}
}
