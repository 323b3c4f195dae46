package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

// An ingest that reaches its --max-tokens is the end the user planned when
// they sized the store: the store fills up to the limit, the file at which
// it reached it taken in part, its tasks complete, `sched status` shows the
// store stopped at the limit with no failure, and `sched runs` says so.
// The same ingest with a larger limit appends the rest of that file and
// the files left out after the ones already in, which do not change, and
// an ingest whose store is at its limit already stops at its plan, again
// without a failure.
func TestIngestStopsAtItsLimitAsPlanned(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	// Four files of the same number of tokens: they differ in one digit,
	// and the tokenizer was trained on text without digits.
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	for i := 1; i <= 4; i++ {
		var text strings.Builder
		for range 20 {
			fmt.Fprintf(&text, `{"text":"package main\nfunc f() { x := %d }\n"}`+"\n", i)
		}
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("%d.jsonl", i)), []byte(text.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := testsvc.StartRedis(t)
	s3 := testsvc.S3(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src,
		"KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey, "KILN_S3_SECRET_KEY=" + s3.SecretKey}
	ingestWith := func(args ...string) {
		t.Helper()
		out, errOut, code := sched(t, env, append([]string{"ingest", "--tokenizer", "tk"}, args...)...)
		if code != 0 || !strings.Contains(out, "queued ingest:plan:") {
			t.Fatalf("ingest %v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	startWorker(t, env, "--queues", "ingest=2,append=1")

	// One file's tokens, through the queue into a store of its own.
	ingestWith("local:"+filepath.Join(src, "1.jsonl"), "--store", "one")
	waitOutput(t, env, regexp.MustCompile(`(?m)^one \(.*\)  files 1/1 done  .*  done`), time.Minute, "status")
	one, err := tokens.ReadManifest(filepath.Join(data, "tokens", "one"))
	if err != nil {
		t.Fatal(err)
	}
	perFile := one.Tokens

	// Room for two and a half files: two go in, half of the third, and
	// the fourth is left out.
	glob := "local:" + filepath.Join(src, "*.jsonl")
	limit := 2*perFile + perFile/2
	ingestWith(glob, "--store", "code", "--max-tokens", strconv.FormatInt(limit, 10))
	at := "stopped at " + formatLimits(ingest.Limits{MaxTokens: limit})
	stopped := regexp.MustCompile(`(?m)^code \(.*\)  files 2/4 done  .*  ` + regexp.QuoteMeta(at) + `  2 left out or taken in part at --max-tokens`)
	out := waitOutput(t, env, stopped, time.Minute, "status")
	storeDir := filepath.Join(data, "tokens", "code")
	m, err := tokens.ReadManifest(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != 3 || m.Tokens <= 2*perFile || m.Tokens > limit || m.Shards[2].Part.To == 0 {
		t.Fatalf("the store holds %d shards, %d tokens; want 2 files of %d tokens and part of a third, at most %d in all", len(m.Shards), m.Tokens, perFile, limit)
	}
	// The dataset's tokens are those of the files done and of the part
	// of the third that went in: the store's.
	if l := lineOf(out, "code ("); !strings.Contains(l, "  "+formatCount(m.Tokens, "tok")+"  ") || strings.Contains(l, "failed") {
		t.Fatalf("dataset line %q; want the store's %d tokens and no failure", l, m.Tokens)
	}
	if !strings.Contains(out, "FAILURES in the last hour\nnone\n") {
		t.Fatalf("status lists failures for an ingest that reached its limit:\n%s", out)
	}
	q := scheduler.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	defer q.Close()
	snap, err := q.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stops := 0
	for _, ts := range snap.Tasks {
		if ts.State == "archived" || ts.State == "retry" {
			t.Fatalf("task %s is %s: %s", ts.ID, ts.State, ts.LastErr)
		}
		if ts.HasProgress && ts.Progress.State == "stopped" {
			stops++
			// The append that took part of its file, or one refused,
			// or the shard that started once the store was full and
			// left its file unread.
			msg := ts.Progress.Message
			refused := ts.Kind == scheduler.KindIngestAppend && (strings.Contains(msg, "would pass --max-tokens "+strconv.FormatInt(limit, 10)) ||
				strings.Contains(msg, "reached --max-tokens "+strconv.FormatInt(limit, 10)+" with part of "))
			unread := ts.Kind == scheduler.KindIngestShard && strings.Contains(msg, "full at --max-tokens "+strconv.FormatInt(limit, 10)) &&
				(strings.Contains(msg, " was not read") || strings.Contains(msg, " was downloaded but not tokenized"))
			if ts.State != "completed" || !refused && !unread || !strings.Contains(msg, "raise the limit and plan again") {
				t.Fatalf("stopped %s task %s: %s, %q", ts.Kind, ts.ID, ts.State, msg)
			}
		}
	}
	if stops != 2 {
		t.Fatalf("%d tasks stopped at the limit; want one for the file taken in part and one for the file left out", stops)
	}
	for _, d := range snap.Datasets() {
		// The tokens count the part of the third file that went in.
		if d.Store == "code" && (d.Done != 2 || d.Stopped != 2 || d.Failed != 0 || d.Tokens != m.Tokens || d.StoppedAt.MaxTokens != limit) {
			t.Fatalf("dataset %+v; want 2 files done and 2 stopped at %d, %d tokens in all as the store holds", d, limit, m.Tokens)
		}
	}
	out, _, _ = sched(t, env, "runs")
	if n := strings.Count(out, "  completed  stopped at its ingest's limit, as planned"); n != 2 || strings.Contains(out, "failed") {
		t.Fatalf("sched runs shows %d tasks stopped at the limit, want 2, and no failure:\n%s", n, out)
	}

	// A larger limit appends the rest of the file in part and the file
	// left out after what is in.
	before, err := os.ReadFile(filepath.Join(storeDir, "tokens.bin"))
	if err != nil {
		t.Fatal(err)
	}
	ingestWith(glob, "--store", "code", "--max-tokens", strconv.FormatInt(10*perFile, 10))
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^code \(.*\)  files 4/4 done  .*  done$`), time.Minute, "status")
	m2, err := tokens.ReadManifest(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	// The part taken before and the rest taken now count both.
	if l := lineOf(out, "code ("); !strings.Contains(l, "  "+formatCount(m2.Tokens, "tok")+"  ") {
		t.Fatalf("dataset line %q after the larger limit; want the store's %d tokens", l, m2.Tokens)
	}
	after, err := os.ReadFile(filepath.Join(storeDir, "tokens.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Shards) != 5 || m2.Tokens != 4*perFile || m2.Shards[0] != m.Shards[0] || m2.Shards[1] != m.Shards[1] || m2.Shards[2] != m.Shards[2] ||
		len(after) < len(before) || !bytes.Equal(after[:len(before)], before) {
		t.Fatalf("after the larger limit: %d shards, %d tokens, first shards %+v (were %+v); want the three in unchanged and two more",
			len(m2.Shards), m2.Tokens, m2.Shards[:min(3, len(m2.Shards))], m.Shards)
	}

	// A store at its limit already: the plan stops, and that is no failure.
	ingestWith(glob, "--store", "code", "--max-tokens", strconv.FormatInt(perFile, 10))
	at = "stopped at " + formatLimits(ingest.Limits{MaxTokens: perFile})
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^code \(.*\)  files 4/4 done  .*  `+regexp.QuoteMeta(at)+`$`), time.Minute, "status")
	if !strings.Contains(out, "FAILURES in the last hour\nnone\n") {
		t.Fatalf("status lists failures after a plan found its store at the limit:\n%s", out)
	}
	if m3, err := tokens.ReadManifest(storeDir); err != nil || m3.Tokens != m2.Tokens {
		t.Fatalf("the store changed after a plan at its limit: %v", err)
	}
}

func TestFormatLimits(t *testing.T) {
	for _, c := range []struct {
		l    ingest.Limits
		want string
	}{
		{ingest.Limits{MaxTokens: 300_000}, "--max-tokens 300K"},
		{ingest.Limits{MaxTokens: 1_500_000_000}, "--max-tokens 1.5B"},
		{ingest.Limits{MaxTokens: 25_000_000_000}, "--max-tokens 25B"},
		{ingest.Limits{MaxTokens: 999}, "--max-tokens 999"},
		{ingest.Limits{MaxDisk: 50 << 30}, "--max-disk 50G"},
		{ingest.Limits{MaxDisk: 12289}, "--max-disk 12289"},
		{ingest.Limits{MaxDisk: 150_000}, "--max-disk 150KB"},
		{ingest.Limits{MaxDisk: 2_000_000_000}, "--max-disk 2GB"},
		{ingest.Limits{MaxDisk: 1536 << 20}, "--max-disk 1.5G"},
		{ingest.Limits{MaxTokens: 2_500_000, MaxDisk: 512 << 20}, "--max-tokens 2.5M or --max-disk 512M"},
	} {
		got := formatLimits(c.l)
		if got != c.want {
			t.Errorf("%+v: %q, want %q", c.l, got, c.want)
		}
		// What status shows reads back as the limit it names.
		if c.l.MaxTokens > 0 && c.l.MaxDisk == 0 {
			if n, err := parseCount(strings.TrimPrefix(got, "--max-tokens ")); err != nil || n != c.l.MaxTokens {
				t.Errorf("%q reads back as %d, %v", got, n, err)
			}
		}
		if c.l.MaxDisk > 0 && c.l.MaxTokens == 0 {
			if n, err := parseBytes(strings.TrimPrefix(got, "--max-disk ")); err != nil || n != c.l.MaxDisk {
				t.Errorf("%q reads back as %d, %v", got, n, err)
			}
		}
	}
}
