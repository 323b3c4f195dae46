package scheduler

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/tokens"
)

func TestConfigDefaultsAndValidate(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.RedisURL != DefaultRedisURL || c.S3Bucket != "kiln" || c.ShutdownGrace != DefaultShutdownGrace {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	bad := []struct {
		mut   func(*Config)
		field string
	}{
		{func(c *Config) { c.RedisURL = "localhost:6379" }, "KILN_REDIS_URL"},
		{func(c *Config) { c.RedisURL = "redis://h:1/x" }, "KILN_REDIS_URL"},
		{func(c *Config) { c.RedisURL = "redis://h:99999/0" }, "port 99999 in"},
		{func(c *Config) { c.RedisURL = "redis://h:0/0" }, "port 0 in"},
		{func(c *Config) { c.S3Endpoint = "http://minio:9000"; c.S3AccessKey, c.S3SecretKey = "a", "b" }, "KILN_S3_ENDPOINT"},
		{func(c *Config) { c.S3Endpoint = "minio:9000" }, "KILN_S3_ACCESS_KEY"},
		{func(c *Config) { c.S3Bucket = "Kiln_Bucket" }, "KILN_S3_BUCKET"},
		{func(c *Config) { c.LogFormat = "xml" }, "KILN_LOG_FORMAT"},
		{func(c *Config) { c.ShutdownGrace = -time.Second }, "KILN_SHUTDOWN_GRACE"},
		{func(c *Config) { c.MetricsAddr = "9400" }, "KILN_METRICS_ADDR"},
		{func(c *Config) { c.MetricsAddr = ":99999" }, "port from 0 to 65535"},
		{func(c *Config) { c.MetricsAddr = ":http" }, "port from 0 to 65535"},
	}
	for _, b := range bad {
		c := Config{}.WithDefaults()
		b.mut(&c)
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), b.field) {
			t.Errorf("Validate(%+v) = %v; want a ConfigError naming %s", c, err, b.field)
		}
	}
}

func TestConfigMaskedHidesSecrets(t *testing.T) {
	c := Config{RedisURL: "redis://:hunter2@redis:6379/0", S3SecretKey: "s3cret", HFToken: "hf_abc"}.WithDefaults()
	s := strings.Join([]string{c.Masked().RedisURL, c.Masked().S3SecretKey, c.Masked().HFToken}, " ")
	for _, secret := range []string{"hunter2", "s3cret", "hf_abc"} {
		if strings.Contains(s, secret) {
			t.Errorf("masked config shows %q: %s", secret, s)
		}
	}
	if !strings.Contains(c.Masked().RedisURL, "redis:6379") {
		t.Errorf("masked URL lost its host: %s", c.Masked().RedisURL)
	}
}

// An ingest task's payload is the pipeline's own job: what the plan queues
// is, field for field, what the shard worker hands the pipeline.
func TestPayloadRoundTripAndVersion(t *testing.T) {
	lim := ingest.Limits{MaxTokens: 5 << 20, MaxDisk: 1 << 30}
	for _, in := range []Args{
		IngestPlan{Dataset: "the-stack-v2", Revision: "main", Vars: map[string][]string{"language": {"Go", "Python"}}, Store: "s",
			Tokenizer: "tk", Seed: 7, MaxFiles: 3, Limits: lim},
		IngestShard{Dataset: "d", Repo: "org/d", Revision: "abc", Path: "data/a.parquet", Size: 10, SHA256: "ff", GitOID: "ee",
			Columns: ingest.Columns{Text: "content", ID: "blob_id", Blob: "blob_id", Encoding: "src_encoding"}, Store: "s",
			Tokenizer: "tk", ShardID: "d-a", Limits: lim},
		IngestAppend{Store: "s", ShardID: "d-a", Object: "tokens/s/shards/d-a.bin", Dataset: "d", Source: "org/d/data/a.parquet",
			Revision: "abc", SHA256: "ff", Documents: 3, Tokens: 99, Tokenizer: tokens.Tokenizer{Name: "tk", SHA256: "aa", VocabSize: 512, EOS: 1},
			Skipped: ingest.Skips{"binary": 2}, SkipReason: "", Limits: lim},
	} {
		b, err := Encode(in)
		if err != nil {
			t.Fatal(err)
		}
		var out Args
		switch in.(type) {
		case IngestPlan:
			out, err = Decode[IngestPlan](b)
		case IngestShard:
			out, err = Decode[IngestShard](b)
		case IngestAppend:
			out, err = Decode[IngestAppend](b)
		}
		if err != nil || !reflect.DeepEqual(out, in) {
			t.Fatalf("%s round trip:\n got %+v, %v\nwant %+v", in.Kind(), out, err, in)
		}
	}
	p, _ := PolicyFor(KindIngestShard)
	v := strconv.Itoa(p.Version)
	for name, raw := range map[string]string{
		"future version":   `{"v":99,"args":{"dataset":"d"}}`,
		"previous version": `{"v":` + strconv.Itoa(p.Version-1) + `,"args":{"dataset":"d","column":"content"}}`,
		"not json":         "\x00\x01garbage",
		"no args":          `{"v":` + v + `}`,
		"wrong types":      `{"v":` + v + `,"args":{"size":"big"}}`,
	} {
		_, err := Decode[IngestShard]([]byte(raw))
		var pe *PayloadError
		if !errors.As(err, &pe) || !errors.Is(err, asynq.SkipRetry) {
			t.Errorf("%s: Decode = %v; want a PayloadError that skips retries", name, err)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is not one line: %q", name, err)
		}
		if strings.HasSuffix(name, "version") && !strings.Contains(err.Error(), "(it reads "+v+")") {
			t.Errorf("%s: %q does not say which version this build reads", name, err)
		}
		// What to do: an older kiln's work is queued again by its command
		// once the older workers status marks are upgraded (sched retry
		// would queue the same payload); a newer kiln's waits for this
		// worker's upgrade. Within what sched runs shows, for the kind of
		// the longest name at two-digit versions.
		for want, in := range map[string]string{
			"an older kiln queued it; upgrade the workers sched status marks, then sched enqueue the work again (not sched retry)": "previous version",
			"a newer kiln queued it; upgrade this worker to that kiln, then 'sched retry' the task":                                "future version",
		} {
			if name != in {
				continue
			}
			if !strings.HasSuffix(err.Error(), want) {
				t.Errorf("%s: %q; want it to end %q", name, err, want)
			}
			longest := ""
			for _, k := range Kinds() {
				if len(k) > len(longest) {
					longest = k
				}
			}
			queued, reads := 11, 10
			if in == "previous version" {
				queued, reads = 10, 11
			}
			if msg := (&PayloadError{longest, versionMsg(queued, reads)}).Error(); !strings.HasSuffix(msg, want) || len(msg) > 200 {
				t.Errorf("%q: %d characters; want it within 200", msg, len(msg))
			}
		}
	}
}

func TestTaskIDFollowsContent(t *testing.T) {
	a := IngestShard{Dataset: "d", Path: "a"}
	b := IngestShard{Dataset: "d", Path: "b"}
	ia, _ := TaskID(a)
	ia2, _ := TaskID(a)
	ib, _ := TaskID(b)
	if ia != ia2 || ia == ib || !strings.HasPrefix(ia, KindIngestShard+":") {
		t.Fatalf("ids: %s %s %s", ia, ia2, ib)
	}
}

func TestEveryKindHasPolicyAndTrainIsNotCutAt30Minutes(t *testing.T) {
	for _, k := range Kinds() {
		p, ok := PolicyFor(k)
		if !ok || p.Queue == "" || p.Version < 1 || p.Timeout <= 0 || p.Retention <= 0 {
			t.Errorf("kind %s: policy %+v", k, p)
		}
	}
	if p, _ := PolicyFor(KindTrainSegment); p.Timeout < 24*time.Hour || p.Queue != QueueGPU {
		t.Errorf("train:segment policy %+v: its timeout must not cut a segment", p)
	}
	if p, _ := PolicyFor(KindIngestAppend); p.Queue != QueueAppend {
		t.Errorf("ingest:append goes to %s, want append", p.Queue)
	}
}

func TestRetryDelayBacksOffWithinBounds(t *testing.T) {
	task := asynq.NewTask(KindIngestShard, nil)
	p, _ := PolicyFor(KindIngestShard)
	prev := time.Duration(0)
	for n := 0; n < 20; n++ {
		d := RetryDelay(n, errors.New("x"), task)
		if d < p.Backoff*8/10 || d > p.MaxBackoff*12/10 {
			t.Fatalf("retry %d: delay %v outside [%v, %v]", n, d, p.Backoff, p.MaxBackoff)
		}
		if n < 3 && d < prev/2 {
			t.Fatalf("retry %d: delay %v fell from %v", n, d, prev)
		}
		prev = d
	}
}

func TestEnqueueDuplicateAndCancel(t *testing.T) {
	c, _ := newTestClient(t)
	ctx := context.Background()
	a := IngestShard{Dataset: "d", Path: "p", Store: "s", Tokenizer: "t"}
	info, err := c.Enqueue(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if info.Queue != QueueIngest || info.Timeout <= 0 || info.Retention <= 0 {
		t.Fatalf("task info %+v", info)
	}
	_, err = c.Enqueue(ctx, a)
	var dup *DuplicateError
	if !errors.As(err, &dup) || dup.ID != info.ID || dup.State != "pending" {
		t.Fatalf("second enqueue: %v; want duplicate of %s (pending)", err, info.ID)
	}
	res, err := c.EnqueueMany(ctx, []Args{a, IngestShard{Dataset: "d", Path: "q"}}, 4)
	if err != nil || res.Enqueued != 1 || res.Duplicates != 1 {
		t.Fatalf("EnqueueMany = %+v, %v", res, err)
	}
	st, err := c.Status(ctx)
	if err != nil || st[0].Name != QueueIngest || st[0].Pending != 2 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if s, err := c.Cancel(ctx, info.ID); err != nil || s != "withdrawn" {
		t.Fatalf("cancel: %s, %v", s, err)
	}
	if _, err := c.Cancel(ctx, "nope"); err == nil {
		t.Fatal("cancel of an unknown id succeeded")
	}
	runs, err := c.Runs(ctx, 10)
	if err != nil || len(runs) != 1 || runs[0].ID != info.ID || runs[0].State != "archived" {
		t.Fatalf("runs: %+v, %v", runs, err)
	}
}

// newTestClient is a Client of a fresh real Redis, closed with the test,
// and that Redis's options for an asynq server or inspector.
func newTestClient(t *testing.T) (*Client, asynq.RedisConnOpt) {
	t.Helper()
	r := testsvc.StartRedis(t)
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c, opt
}
