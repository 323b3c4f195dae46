package runs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func isBadInput(err error) bool {
	var b interface{ BadInput() bool }
	return errors.As(err, &b) && b.BadInput()
}

func TestPresetsMatchTheSeedPlan(t *testing.T) {
	s := Presets()
	p, err := s.Get("pilot")
	if err != nil {
		t.Fatal(err)
	}
	// Task 8 step 4: seq 1024, batch 8, accumulate 16, lr 4e-4, warmup 2000,
	// checkpoint every 1000, 2B tokens, cosine to 0.1, 70/20/10 mixture.
	if p.Model != "small" || p.Seq != 1024 || p.Batch != 8 || p.Accumulate != 16 || p.LR != 4e-4 ||
		p.Warmup != 2000 || p.CheckpointEvery != 1000 || p.TotalTokens != 2e9 || p.FloorOr() != 0.1 {
		t.Errorf("pilot = %+v", p.RunConfig)
	}
	if p.TotalSteps != 15259 { // ceil(2e9 / (8*16*1024))
		t.Errorf("pilot total steps %d", p.TotalSteps)
	}
	want := map[string]float64{"the-stack-v2": 0.7, "fineweb-edu": 0.2, "proof-pile-2": 0.1}
	if len(p.Mixture) != 3 {
		t.Fatalf("pilot mixture %+v", p.Mixture)
	}
	for _, m := range p.Mixture {
		if want[m.Store] != m.Weight {
			t.Errorf("pilot mixture %s = %v", m.Store, m.Weight)
		}
	}
	if p.MinFreeDisk != 20<<30 || p.Retention.KeepLast != 3 || p.Segment.MaxDuration != 6*time.Hour {
		t.Errorf("pilot queue settings %+v %+v %v", p.Retention, p.Segment, p.MinFreeDisk)
	}

	l, err := s.Get("long")
	if err != nil {
		t.Fatal(err)
	}
	// Same recipe, 25B tokens.
	if l.TotalTokens != 25e9 || l.LR != p.LR || l.Seq != p.Seq || l.Accumulate != p.Accumulate || len(l.Mixture) != 3 || l.Retention.KeepEvery != 25 {
		t.Errorf("long = %+v", l)
	}
	if l.Description == p.Description || l.From != "pilot" {
		t.Errorf("long must describe itself and say where it came from: %+v", l)
	}

	d, err := s.Get("demo")
	if err != nil {
		t.Fatal(err)
	}
	if d.Model != "tiny" || d.Segment.MaxDuration != 4*time.Minute || d.Tokenizer == "" {
		t.Errorf("demo = %+v", d)
	}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUserFileOverridesAndExtends(t *testing.T) {
	path := writeFile(t, `
pilot:
  lr: 3.0e-4
  mixture:
    - {store: the-stack-v2, weight: 1}
mine:
  from: long
  total_tokens: 5000000000
  retention: {keep_last: 5}
scratch:
  model: tiny
  total_steps: 10
  checkpoint_every: 5
  retention: {keep_last: 1}
  mixture: [{store: /data/x}]
minimal:
  model: tiny
  total_steps: 10
  checkpoint_every: 5
  mixture: [{store: /data/x}]
`)
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Get("pilot")
	if err != nil {
		t.Fatal(err)
	}
	if p.LR != 3e-4 || p.Warmup != 2000 || len(p.Mixture) != 1 {
		t.Errorf("override must change lr and mixture and keep the rest: %+v", p.RunConfig)
	}
	m, err := s.Get("mine")
	if err != nil {
		t.Fatal(err)
	}
	if m.TotalTokens != 5e9 || m.Retention.KeepLast != 5 || m.Retention.KeepEvery != 25 || m.Seq != 1024 {
		t.Errorf("mine = %+v", m)
	}
	if _, err := s.Get("scratch"); err != nil {
		t.Errorf("scratch: %v", err)
	}
	// A new run that says nothing of retention keeps the default number.
	if m, err := s.Get("minimal"); err != nil || m.Retention.KeepLast != DefaultKeepLast {
		t.Errorf("minimal: %+v, %v; want retention.keep_last %d", m.Retention, err, DefaultKeepLast)
	}
	// The embedded presets are untouched by a user file.
	if Presets()["pilot"].LR != 4e-4 || len(Presets()["pilot"].Mixture) != 3 {
		t.Error("a user file changed the embedded presets")
	}
}

// A run's length is one setting written two ways: the way an entry writes
// it replaces the other way its parent wrote it, so that a total_steps
// inherited from `from:` (or from the preset of the entry's name) does not
// silently win over the total_tokens written here, nor the other way round.
func TestRunLengthWrittenReplacesTheInheritedOne(t *testing.T) {
	s, err := Load(writeFile(t, `
r3: {from: pilot-cpu, total_tokens: 1000000}
r4: {from: pilot, total_steps: 50}
r5: {from: r3}
both: {from: pilot-cpu, total_steps: 7, total_tokens: 1000000}
pilot-cpu: {total_tokens: 25600}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		run    string
		steps  int
		tokens int64
	}{
		// pilot-cpu trains 2 x 4 x 32 = 256 tokens a step.
		{"r3", 3907, 1000000}, // ceil(1e6 / 256), not pilot-cpu's 120 steps
		{"r4", 50, 0},         // not pilot's 2e9 tokens
		{"r5", 3907, 1000000}, // r3's length, inherited whole
		{"both", 7, 1000000},  // one entry that writes both: total_steps wins, as in any run configuration
		{"pilot-cpu", 100, 25600},
	} {
		r, err := s.Get(c.run)
		if err != nil {
			t.Errorf("%s: %v", c.run, err)
			continue
		}
		if r.TotalSteps != c.steps || r.TotalTokens != c.tokens {
			t.Errorf("%s: total_steps %d, total_tokens %d; want %d, %d", c.run, r.TotalSteps, r.TotalTokens, c.steps, c.tokens)
		}
	}
	// The embedded pilot-cpu writes total_steps over pilot's total_tokens.
	if p := Presets()["pilot-cpu"]; p.TotalSteps != 120 || p.TotalTokens != 0 {
		t.Errorf("preset pilot-cpu: total_steps %d, total_tokens %d; want 120, 0", p.TotalSteps, p.TotalTokens)
	}
}

func TestBadRunsFilesSayWhatToFix(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"pilot:\n  learning_rate: 1\n", "learning_rate"},
		// The file's own line, the key, the key meant and the keys a run takes.
		{"pilot:\n  lr: 1\nmine:\n  from: pilot\n\n  totl_steps: 100\n", `run mine: line 6: unknown key "totl_steps" (did you mean total_steps?); the keys here are accumulate, batch, beta1,`},
		{"pilot:\n  segment:\n    max_step: 5\n", `run pilot: line 3: unknown key "max_step" (did you mean max_steps?); the keys here are max_duration, max_steps`},
		{"pilot:\n  mixture:\n    - {store: code, wieght: 1}\n", `run pilot: line 3: unknown key "wieght" (did you mean weight?)`},
		{"pilot:\n  batch: 2.5\n", `run pilot: line 2: 2.5 is not a whole number`},
		{"pilot:\n  lr: fast\n", "run pilot: line 2: cannot unmarshal !!str `fast` into a number"},
		{"x:\n  from: nothing\n", `from "nothing"`},
		{"x:\n  lr: 1\n", "needs `from: <run>`"},
		{"- a\n- b\n", "map run names"},
		// A setting at the top level, as if a run: said so, not in Go's
		// words for the struct it was read into.
		{"mine:\n  from: pilot\ntokenizr: x\n", `line 3: run tokenizr is "x", not its settings: write each of a run's settings on a line of its own, indented under the run's name`},
		{"mine: {from: pilot}\nlr: [1, 2]\n", `line 2: run lr is a list, not its settings`},
		// A duration with no unit: the key and what to write.
		{"pilot:\n  segment:\n    max_duration: 90\n", "run pilot: line 3: segment.max_duration: 90 has no unit: write 90s (or 5m, 1h)"},
		{"pilot:\n  min_free_disk: lots\n", `run pilot: line 2: size "lots" is not a number of bytes with an optional unit, such as 50G or 512MiB`},
		{"pilot: [\n", "runs file"},
		// A tab an editor put in the indentation is named on its own line.
		{"mine:\n  from: pilot\n\ttotal_steps: 10\n", "line 3: a tab in the indentation: YAML indents with spaces only"},
		// A run's name becomes a directory and an object key: the rule
		// every name kiln is given follows.
		{"pilot:\n  lr: 1\nmy run:\n  from: pilot\n", `line 3: run name "my run": use letters, digits, '-', '_' or '.'`},
		{".hidden:\n  from: pilot\n", `run name ".hidden"`},
		// A run written twice would be its two bodies merged.
		{"dk:\n  from: pilot\n  batch: 2\ndk:\n  batch: 7\n", "line 4: run dk is written a second time (first at line 1): keep one, or give this one another name"},
	} {
		_, err := Load(writeFile(t, c.body))
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: want a bad-input error containing %q, got %v", c.body, c.want, err)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "absent.yaml")); err == nil || !isBadInput(err) {
		t.Errorf("missing file: %v", err)
	}
}

func TestGetValidates(t *testing.T) {
	s, err := Load(writeFile(t, "pilot:\n  retention: {keep_last: 0}\nlong:\n  seq: 99999\n"+
		"up:\n  from: pilot\n  retention: {keep_last: 2}\n  mixture:\n    - {store: ../../etc, weight: 1}\n"+
		"abs:\n  from: pilot\n  retention: {keep_last: 2}\n  mixture:\n    - {store: /srv/tokens/code, weight: 1}\n"+
		"negsteps:\n  from: abs\n  total_steps: -10\nnegtokens:\n  from: abs\n  total_tokens: -5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("abs"); err != nil {
		t.Errorf("a store named by its absolute path: %v", err)
	}
	for name, want := range map[string]string{"pilot": "retention.keep_last", "long": "seq 99999", "nope": "unknown run",
		"negsteps": "total_steps must be positive, got -10", "negtokens": "total_tokens must be positive, got -5",
		"up": `mixture[0] store "../../etc": name a token store of the worker's data directory`} {
		_, err := s.Get(name)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want %q, got %v", name, want, err)
		}
	}
}

// A runs file's sizes read as the command line's do: 20G and 20GiB are
// 20 x 2^30 bytes, 20GB 20 x 10^9, and a size writes back as it reads.
func TestRunsFileSizesReadAsEverySize(t *testing.T) {
	s, err := Load(writeFile(t, "a:\n  from: pilot\n  min_free_disk: 20G\nb:\n  from: pilot\n  min_free_disk: 20gib\n"+
		"c:\n  from: pilot\n  min_free_disk: 20 GB\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]ByteSize{"a": 20 << 30, "b": 20 << 30, "c": 20e9} {
		r, err := s.Get(name)
		if err != nil || r.MinFreeDisk != want {
			t.Errorf("%s: min_free_disk %d, %v; want %d", name, r.MinFreeDisk, err, want)
		}
	}
	if got := ByteSize(20 << 30).String(); got != "20GiB" {
		t.Errorf("20 x 2^30 bytes written as %q", got)
	}
}

// A size written as 0 would read as absent and train with the default, so
// `sched runs --presets` would list the run as valid with a size nobody
// wrote: it is refused where the file says it, as LoadRunConfig does.
func TestRunsFileRefusesZeroSizes(t *testing.T) {
	for _, c := range []struct{ body, want string }{
		{"pilot: {seq: 0}\n", "line 1: seq is 0"},
		{"pilot:\n  batch: 0\n", "line 2: batch is 0"},
		{"pilot:\n  accumulate: 00\n", "line 2: accumulate is 0"},
		{"mine:\n  from: pilot\n  seq: 0\n", "run mine: line 3: seq is 0"},
		{"pilot:\n  moe: {experts: 8, top_k: 0}\n", "moe.top_k is 0"},
		{"pilot:\n  moe: {experts: 8, d_ff: 0}\n", "moe.d_ff is 0"},
		{"pilot:\n  lr: 0\n", "line 2: lr is 0"},
		{"pilot:\n  eps: 0.0\n", "line 2: eps is 0"},
		// Trained as 4 batches, where it meant none.
		{"pilot:\n  eval_batches: 0\n", "line 2: eval_batches is 0: give a positive value, or leave it out; for no evaluation, set eval_every: 0"},
		{"pilot:\n  mixture:\n    - {store: a, weight: 1}\n    - {store: b, weight: 0}\n", "line 4: mixture[1] weight is 0"},
	} {
		path := writeFile(t, c.body)
		_, err := Load(path)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "runs file "+path+": run ") ||
			!strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "leave ") {
			t.Errorf("%q: want a bad-input error naming the file, the run and %q, got %v", c.body, c.want, err)
		}
	}
	// A 0 that means something is still taken: no bound on a segment, no
	// extra checkpoints kept, no evaluation, a cosine to zero, no clipping.
	s, err := Load(writeFile(t, "pilot:\n  segment: {max_steps: 0}\n  retention: {keep_every: 0}\n  eval_every: 0\n  eval_batches: 0\n  batch: 4\n  floor: 0\n  clip: 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := s.Get("pilot"); err != nil || p.Batch != 4 || p.Retention.KeepEvery != 0 {
		t.Errorf("pilot: %+v, %v", p.RunConfig, err)
	} else if rc := p.RunConfig.WithDefaults(); rc.FloorOr() != 0 || rc.ClipOr() != 0 {
		t.Errorf("pilot's floor: 0 and clip: 0 became %g and %g", rc.FloorOr(), rc.ClipOr())
	}
}

// A tokenizer name that cannot be one is refused naming the file, the run
// and the line, not only the name.
func TestRunsFileRefusesABadTokenizerName(t *testing.T) {
	for _, bad := range []string{"a/b", "-x", "../up"} {
		path := writeFile(t, "pilot:\n  lr: 1.0e-4\nmine:\n  from: pilot\n  tokenizer: "+bad+"\n")
		_, err := Load(path)
		want := "runs file " + path + ": run mine: line 5: tokenizer name \"" + bad + "\""
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want a bad-input error containing %q, got %v", bad, want, err)
		}
	}
}
