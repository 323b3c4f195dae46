package tokens

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// crashChildEnv makes the test binary an appending child: it appends every
// crash shard to the store named by the variable, printing "committed ID"
// after each Append returns, and is SIGKILLed by the parent at random.
const crashChildEnv = "KILN_TOKENS_CRASH_CHILD"

const crashShards = 300

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		os.Exit(crashChild(dir))
	}
	os.Exit(m.Run())
}

func crashShardID(i int) string { return fmt.Sprintf("shard-%03d", i) }

// crashShard is shard i's content: mostly small, every 15th larger than the
// appender's 1 MiB read so that kills land between its partial writes.
func crashShard(i int) []uint32 {
	n := 500 + (i*7919)%20000
	if i%15 == 7 {
		n = 600_000
	}
	return shardIDs(uint64(i), n, uint32(testTok.VocabSize), testTok.EOS)
}

// lazyShard builds shard i's bytes on the first Read, so that a retried
// child spends its time on the appends that are not yet committed rather
// than on generating shards that Append skips unread.
type lazyShard struct {
	i int
	r *bytes.Reader
}

func (l *lazyShard) Read(p []byte) (int, error) {
	if l.r == nil {
		l.r = bytes.NewReader(Encode(nil, Uint16, crashShard(l.i)))
	}
	return l.r.Read(p)
}

func crashChild(dir string) int {
	ctx := context.Background()
	var a *Appender
	var err error
	// The killed predecessor's flock is released by the kernel once it is
	// reaped, which the parent waits for; retry only as a safeguard.
	for range 100 {
		if a, err = OpenAppender(ctx, dir, testTok, nil); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 3
	}
	for i := range crashShards {
		info := ShardInfo{ID: crashShardID(i), Source: "crash"}
		var err error
		if _, in := a.index[info.ID]; i%2 == 1 && !in {
			// Every other shard is checked first and written whole
			// (AppendChecked), as a prefetched shard is.
			var c *CheckedShard
			if c, err = CheckShard(dir, info, testTok, Encode(nil, Uint16, crashShard(i))); err == nil {
				_, err = a.AppendChecked(ctx, c)
			}
		} else {
			_, err = a.Append(ctx, info, &lazyShard{i: i})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "append:", err)
			return 4
		}
		fmt.Printf("committed %s\n", crashShardID(i))
	}
	if err := a.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
		return 5
	}
	return 0
}

// runCrashChild starts an appending child, SIGKILLs it after delay (never,
// if delay < 0) and returns the shard ids it reported committed and whether
// it ran to completion.
func runCrashChild(t *testing.T, dir string, delay time.Duration) (committed []string, finished bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "committed "); ok {
				committed = append(committed, id)
			}
		}
	})
	if delay >= 0 {
		time.Sleep(delay)
		cmd.Process.Kill()
	}
	wg.Wait()
	err = cmd.Wait()
	if err == nil {
		return committed, true
	}
	if delay < 0 || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("appending child failed: %v: %s", err, stderr.String())
	}
	return committed, false
}

// checkCrashStore asserts that the store is readable, holds each shard in
// mustHave, holds no shard twice, and holds each shard's exact ids at its
// recorded offset.
func checkCrashStore(t *testing.T, dir string, mustHave map[string]bool, shards map[int][]uint32) int {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatalf("Open after a kill: %v", err)
	}
	defer s.Close()
	m := s.Manifest()
	got := make(map[string]bool, len(m.Shards))
	for i, sh := range m.Shards {
		if got[sh.ID] {
			t.Fatalf("shard %s appended twice", sh.ID)
		}
		got[sh.ID] = true
		// The child appends in order, so the i-th committed shard is shard i.
		if sh.ID != crashShardID(i) {
			t.Fatalf("shard %d is %s, want %s", i, sh.ID, crashShardID(i))
		}
		want, ok := shards[i]
		if !ok {
			want = crashShard(i)
			shards[i] = want
		}
		buf := make([]int32, sh.Tokens)
		if int(sh.Tokens) != len(want) {
			t.Fatalf("shard %s holds %d tokens, want %d", sh.ID, sh.Tokens, len(want))
		}
		if err := s.read(sh.Offset, buf); err != nil {
			t.Fatal(err)
		}
		for j := range want {
			if buf[j] != int32(want[j]) {
				t.Fatalf("shard %s token %d = %d, want %d", sh.ID, j, buf[j], want[j])
			}
		}
	}
	for id := range mustHave {
		if !got[id] {
			t.Fatalf("shard %s was reported committed but is not in the manifest", id)
		}
	}
	return len(m.Shards)
}

func TestSIGKILLNeverLosesOrDuplicatesAShard(t *testing.T) {
	iterations := 40
	if testing.Short() {
		iterations = 10
	}
	dir := t.TempDir()
	// The store exists before the first child, as it does once ingest has
	// appended anything; a kill during creation is covered by
	// TestStoreKilledDuringCreation.
	a, err := OpenAppender(context.Background(), dir, testTok, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	reported := map[string]bool{}
	shards := map[int][]uint32{}
	kills := 0
	for it := 0; it < iterations; it++ {
		// Process start-up takes a few milliseconds; kills are spread from
		// before the first append to well into the run.
		delay := time.Duration(rng.IntN(30_000)) * time.Microsecond
		committed, finished := runCrashChild(t, dir, delay)
		for _, id := range committed {
			reported[id] = true
		}
		n := checkCrashStore(t, dir, reported, shards)
		if finished {
			t.Logf("iteration %d: the child finished before its kill at %v", it, delay)
			break
		}
		kills++
		t.Logf("iteration %d: killed after %v with %d shards committed", it, delay, n)
	}
	committed, finished := runCrashChild(t, dir, -1)
	if !finished {
		t.Fatal("the final child did not finish")
	}
	for _, id := range committed {
		reported[id] = true
	}
	if n := checkCrashStore(t, dir, reported, shards); n != crashShards {
		t.Fatalf("%d shards after the final run, want %d", n, crashShards)
	}
	if kills == 0 {
		t.Fatal("no child was killed mid-run: the kill delays are too long for this machine")
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
}
