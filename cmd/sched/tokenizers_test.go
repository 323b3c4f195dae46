package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/klauspost/compress/zstd"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokenizer/tokenizertest"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/worker"
)

// `sched tokenizers` lists each tokenizer with the stores and runs that use
// it, flags a store made by a tokenizer it does not know, and prints a
// tokenizer's report by name.
func TestTokenizersCommand(t *testing.T) {
	env := append(baseEnv(t), "KILN_TOKENIZER=kiln-bpe")
	data := envValue(env, "KILN_DATA_DIR")
	ctx := context.Background()
	objects, err := store.NewLocal(filepath.Join(data, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	cat := catalog.New(objects, data)
	a, b, stray := trainSmall(t, "alpha beta gamma delta"), trainSmall(t, "one two three four five"), trainSmall(t, "x y z w v u")
	ea, err := cat.Publish(ctx, "kiln-bpe", a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := cat.Publish(ctx, "other", b)
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.PutReport(ctx, catalog.Report{Name: "other", SHA256: eb.SHA256, VocabSize: eb.VocabSize, SpecialTokens: eb.Special,
		Sources: []catalog.SourceReport{{Source: "fineweb-edu", Documents: 3, Bytes: 300, Figures: catalog.Figures{Tokens: 100, BytesPerToken: 3}}}}); err != nil {
		t.Fatal(err)
	}
	for name, tj := range map[string][]byte{"web": a, "code": a, "maths": b, "strays": stray} {
		writeStore(t, filepath.Join(data, "tokens", name), tj)
	}
	objects.Put(ctx, "checkpoints/pilot/step-0000100/tokenizer.json", bytes.NewReader(a), int64(len(a)))

	out, errOut, code := sched(t, env, "tokenizers")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, re := range []string{
		`kiln-bpe \(default\)\s+\d+\s+` + ea.SHA256[:12] + `\s+code,web\s+pilot`,
		`other\s+\d+\s+` + eb.SHA256[:12] + `\s+maths\s+-`,
		`\(unknown\)\s+-\s+\w{12}\s+strays\s+-`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}
	out, _, code = sched(t, env, "tokenizers", "other")
	if code != 0 || !strings.Contains(out, "| fineweb-edu | 3 | 300 | 100 | 3.000 |") {
		t.Fatalf("report: exit %d\n%s", code, out)
	}
	_, errOut, code = sched(t, env, "tokenizers", "missing")
	// The name was the argument: no --tokenizer to name another with.
	if code != 2 || !strings.Contains(errOut, `tokenizer "missing" is not known (known: kiln-bpe, other)`) || !strings.HasSuffix(errOut, ", or name another\n") {
		t.Fatalf("unknown name: exit %d, %q", code, errOut)
	}
	// A damaged tokenizer.json in object storage is listed as such, with
	// where it is, and hides none of the others.
	broken := []byte(`{"model": `)
	objects.Put(ctx, catalog.Key("broken"), bytes.NewReader(broken), int64(len(broken)))
	out, errOut, code = sched(t, env, "tokenizers")
	if code != 0 || !regexp.MustCompile(`(?m)^broken\s+unreadable: `+regexp.QuoteMeta(catalog.Key("broken"))+` in object storage: .*JSON`).MatchString(out) ||
		!regexp.MustCompile(`other\s+\d+\s+`+eb.SHA256[:12]).MatchString(out) {
		t.Errorf("tokenizers with a damaged one: exit %d\n%s%s", code, out, errOut)
	}
	// Published from here, then its copy in object storage damaged: the
	// damaged copy is named, where the line named this machine's intact
	// one; and a copy here cut short beside an intact published one is
	// listed as the two copies that differ, where it was listed whole
	// (sched tokenizers NAME and every task refuse them).
	for _, name := range []string{"twin", "cut"} {
		if _, err := cat.Publish(ctx, name, b); err != nil {
			t.Fatal(err)
		}
	}
	objects.Put(ctx, catalog.Key("twin"), bytes.NewReader(broken), int64(len(broken)))
	cut := filepath.Join(data, "tokenizers", "cut", catalog.FileName)
	if err := os.Truncate(cut, int64(len(b)/2)); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, env, "tokenizers")
	if code != 0 || !regexp.MustCompile(`(?m)^twin\s+unreadable: `+regexp.QuoteMeta(catalog.Key("twin"))+` in object storage: .*JSON`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^cut\s+unreadable: tokenizer "cut" differs between `+regexp.QuoteMeta(cut)+` \(sha256 \w+\) and object storage `+regexp.QuoteMeta(catalog.Key("cut"))).MatchString(out) {
		t.Errorf("tokenizers with a published copy damaged and a local one cut short: exit %d\n%s%s", code, out, errOut)
	}
	// So is a copy on this machine that does not read (a directory in the
	// place of its tokenizer.json), where the whole listing failed.
	odd := filepath.Join(data, "tokenizers", "odd", catalog.FileName)
	if err := os.MkdirAll(odd, 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, env, "tokenizers")
	if code != 0 || !regexp.MustCompile(`(?m)^odd\s+unreadable: `+regexp.QuoteMeta(odd)+`: .*is a directory`).MatchString(out) ||
		!regexp.MustCompile(`other\s+\d+\s+`+eb.SHA256[:12]).MatchString(out) {
		t.Errorf("tokenizers with a directory for one: exit %d\n%s%s", code, out, errOut)
	}
}

// The CLI path on a mixed local corpus (code files, prose in JSON lines,
// maths in zstd JSON lines): `sched enqueue tokenizer` queues the samples,
// a worker configured as `sched worker` configures it samples and trains,
// and `sched tokenizers <name>` prints the compression per source beside
// the configured tokenizer's.
func TestTokenizerFromALocalMixedCorpus(t *testing.T) {
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	env := append(baseEnv(t), "KILN_REDIS_URL="+r.URL(0), "KILN_TOKENIZER=kiln-bpe")
	data := envValue(env, "KILN_DATA_DIR")
	corpus := t.TempDir()
	code := tokenizertest.Documents(tokenizertest.Text(t, "go")+tokenizertest.Text(t, "python"), 1500)
	os.MkdirAll(filepath.Join(corpus, "code"), 0o755)
	for i, c := range code[:120] {
		os.WriteFile(filepath.Join(corpus, "code", fmt.Sprintf("%03d.py", i)), []byte(c), 0o644)
	}
	prose := tokenizertest.Text(t, "english")
	os.MkdirAll(filepath.Join(corpus, "prose"), 0o755)
	var pj bytes.Buffer
	for _, p := range tokenizertest.Documents(prose, 400) {
		b, _ := json.Marshal(map[string]string{"text": p})
		pj.Write(append(b, '\n'))
	}
	os.WriteFile(filepath.Join(corpus, "prose", "web.jsonl"), pj.Bytes(), 0o644)
	os.MkdirAll(filepath.Join(corpus, "maths"), 0o755)
	var mz bytes.Buffer
	zw, _ := zstd.NewWriter(&mz)
	for n := range 300 {
		doc := fmt.Sprintf("\\begin{lemma} Let $f \\colon [0,%d] \\to \\mathbb{R}$ with $|f'(x)| \\le %d$. Then $\\int_0^{%d} f(x)\\,dx \\le %d \\sup_{x} |f(x)|$. \\end{lemma}\n\\begin{proof} Since $\\sum_{k=1}^{n} k^{%d} = O(n^{%d})$, the claim follows. \\end{proof}\n",
			n%9+1, n%4+1, n%9+1, n%9+1, n%3+1, n%3+2)
		b, _ := json.Marshal(map[string]string{"text": doc})
		zw.Write(append(b, '\n'))
	}
	zw.Close()
	os.WriteFile(filepath.Join(corpus, "maths", "arxiv.jsonl.zst"), mz.Bytes(), 0o644)

	// The configured tokenizer (KILN_TOKENIZER, kiln-bpe here) knows prose only.
	objects, err := store.NewLocal(filepath.Join(data, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	cat := catalog.New(objects, data)
	prev, err := tokenizer.Train(ctx, []io.Reader{strings.NewReader(prose)}, tokenizer.TrainOptions{VocabSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cat.Publish(ctx, "kiln-bpe", prev); err != nil {
		t.Fatal(err)
	}

	codeDS, proseDS, mathsDS := "local:"+filepath.Join(corpus, "code", "*.py"), "local:"+filepath.Join(corpus, "prose", "*.jsonl"), "local:"+filepath.Join(corpus, "maths", "*.jsonl.zst")
	out, errOut, code2 := sched(t, env, "enqueue", "tokenizer", "mixed", "--vocab", "1024", "--sample", "80KB",
		"--from", codeDS+"=0.6,"+proseDS+"=0.25,"+mathsDS+"=0.15")
	if code2 != 0 {
		t.Fatalf("enqueue: exit %d: %s", code2, errOut)
	}
	t.Log(out)

	// The worker may read the corpus, as KILN_LOCAL_ROOTS would let it.
	cfg := scheduler.Config{RedisURL: r.URL(0), DataDir: data, LocalRoots: []string{corpus}}.WithDefaults()
	opt, _ := asynq.ParseRedisURI(cfg.RedisURL)
	q := scheduler.NewClient(opt)
	defer q.Close()
	queues := map[string]int{scheduler.QueueIngest: 2, scheduler.QueueAppend: 1}
	hs, err := workerHandlers(ctx, cfg, queues, q, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(worker.Params{Redis: opt, Queues: queues, Handlers: hs, ProgressEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()

	insp := asynq.NewInspector(opt)
	defer insp.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if _, ok, _ := cat.GetReport(ctx, "mixed"); ok {
			break
		}
		arch, _ := insp.ListArchivedTasks(scheduler.QueueIngest)
		arch2, _ := insp.ListArchivedTasks(scheduler.QueueAppend)
		for _, a := range append(arch, arch2...) {
			t.Errorf("archived %s: %s", a.Type, a.LastErr)
		}
		if t.Failed() || time.Now().After(deadline) {
			t.Fatal("no report of tokenizer mixed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The same request again is done: said so, nothing queued, exit 0,
	// as the README's day typed a second time needs; another request
	// under the name is refused, the tokenizer left as it is.
	mixArgs := []string{"enqueue", "tokenizer", "mixed", "--vocab", "1024", "--sample", "80KB", "--from", codeDS + "=0.6," + proseDS + "=0.25," + mathsDS + "=0.15"}
	out, errOut, code2 = sched(t, env, mixArgs...)
	if code2 != 0 || !strings.Contains(out, `tokenizer "mixed" already exists, made by this same request (1024 ids`) || strings.Contains(out, "queued tokenizer:") {
		t.Errorf("the same request again: exit %d, %q %q", code2, out, errOut)
	}
	mixArgs[4] = "512"
	if _, errOut, code2 := sched(t, env, mixArgs...); code2 != 2 || !strings.Contains(errOut, `tokenizer "mixed" already exists (1024 ids`) || !strings.Contains(errOut, "made by another request") {
		t.Errorf("another vocabulary under the name: exit %d, %q", code2, errOut)
	}
	if e, _, err := cat.Resolve(ctx, "mixed"); err != nil || e.VocabSize != 1024 {
		t.Errorf("after the refusal, tokenizer mixed: %+v, %v", e, err)
	}
	rep, _, _ := cat.GetReport(ctx, "mixed")
	for _, s := range rep.Sources {
		if s.Previous == nil || s.Documents == 0 {
			t.Fatalf("source %s: %+v", s.Source, s)
		}
		if s.Source != proseDS && s.BytesPerToken <= s.Previous.BytesPerToken {
			t.Errorf("%s: mixed %.3f bytes/token, kiln-bpe %.3f", s.Source, s.BytesPerToken, s.Previous.BytesPerToken)
		}
	}
	out, errOut, code2 = sched(t, env, "tokenizers", "mixed")
	if code2 != 0 || strings.Count(out, "| local:") != 3 || !strings.Contains(out, "kiln-bpe bytes/token") || !strings.Contains(out, "vocabulary: 1024 ids") {
		t.Fatalf("sched tokenizers mixed: exit %d %s\n%s", code2, errOut, out)
	}
	t.Logf("\n%s", out)
	out, _, _ = sched(t, env, "tokenizers")
	if !regexp.MustCompile(`(?m)^mixed\s+1024\s`).MatchString(out) || !regexp.MustCompile(`(?m)^kiln-bpe \(default\)\s+1024\s`).MatchString(out) {
		t.Fatalf("sched tokenizers:\n%s", out)
	}
}

// The hint of an unknown tokenizer works as written: 'sched tokenizer train'
// into the path it names makes the name known to this machine.
func TestUnknownTokenizersHintMakesItKnown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "kiln")
	env := []string{"KILN_DATA_DIR=" + data, "KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	text := filepath.Join(dir, "text.txt")
	os.WriteFile(text, []byte(strings.Repeat(tokenizertest.Text(t, "go"), 2)), 0o644)
	_, errOut, code := sched(t, env, "tokenize", "--tokenizer", "mine", "--in", text, "--out", filepath.Join(dir, "ids"))
	m := regexp.MustCompile(`on this machine, '(mkdir -p \S+ && sched tokenizer train --in TEXT --out \S+)'`).FindStringSubmatch(errOut)
	if code != 2 || m == nil {
		t.Fatalf("an unknown tokenizer: exit %d, %q; want exit 2 and the command that makes it", code, errOut)
	}
	// Typed as the hint writes it, with a text and a small vocabulary.
	line := strings.Replace(strings.Replace(m[1], "sched ", `"$SCHED" `, 1), "TEXT", text, 1) + " --vocab 300"
	cmd := exec.Command("bash", "-c", line)
	cmd.Env = append(baseEnv(t), append(env, "SCHED="+os.Args[0])...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the hint's command %q: %v\n%s", line, err, out)
	}
	if out, errOut, code := sched(t, env, "tokenize", "--tokenizer", "mine", "--in", text, "--out", filepath.Join(dir, "ids")); code != 0 {
		t.Fatalf("tokenize with the tokenizer the hint made: exit %d\n%s%s", code, out, errOut)
	}
	if out, _, code := sched(t, env, "tokenizers"); code != 0 || lineOf(out, "mine") == "" {
		t.Fatalf("sched tokenizers after the hint: exit %d\n%s", code, out)
	}
}

// A --tokens-dir named by hand that is not a directory is a typo, not a
// host without stores.
func TestTokenizersRefusesATokensDirThatIsNotADirectory(t *testing.T) {
	env := baseEnv(t)
	file := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(file, []byte("text"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{file, filepath.Join(t.TempDir(), "nosuch")} {
		wantBadInput(t, env, `^sched: --tokens-dir .*: not a directory: give the directory that holds the token stores`, "tokenizers", "--tokens-dir", dir)
	}
}
