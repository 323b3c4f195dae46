package main

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

func TestIngestDirectLocalThenDatasets(t *testing.T) {
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	data := filepath.Join(dir, "src")
	os.MkdirAll(data, 0o755)
	os.WriteFile(filepath.Join(data, "a.jsonl"), []byte(`{"text":"package main"}`+"\n"+`{"text":"func f() {}"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(data, "b.jsonl"), []byte("{\"text\":\"bad \xff\"}\n"), 0o644)
	stores := filepath.Join(dir, "stores")
	out, errOut, code := sched(t, nil, "ingest", "local:"+filepath.Join(data, "*.jsonl"), "--direct",
		"--store-dir", filepath.Join(stores, "local"), "--tokenizer-file", tok)
	if code != 0 || !strings.Contains(out, "2 files, 1 appended (2 documents") || !strings.Contains(out, "empty-file=1") {
		t.Fatalf("ingest: code %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = sched(t, nil, "datasets", "--stores", stores)
	if code != 0 || !strings.Contains(out, "the-stack-v2") || !strings.Contains(out, "bigcode/the-stack-v2-dedup") ||
		!strings.Contains(out, "local") || !strings.Contains(out, "empty-file=1") {
		t.Fatalf("datasets: code %d\n%s\n%s", code, out, errOut)
	}
	// Without --stores: the data directory's stores, a damaged one named
	// as such; a data directory with none says so.
	os.MkdirAll(filepath.Join(stores, "broken"), 0o755)
	os.WriteFile(filepath.Join(stores, "broken", tokens.ManifestFile), []byte("{"), 0o644)
	os.Rename(stores, filepath.Join(dir, "tokens"))
	out, errOut, code = sched(t, []string{"KILN_DATA_DIR=" + dir}, "datasets")
	if code != 0 || !regexp.MustCompile(`(?m)^local +[1-9]`).MatchString(out) || !regexp.MustCompile(`(?m)^broken +- +- +0 B +- +damaged: manifest.json does not parse; delete `).MatchString(out) {
		t.Errorf("datasets in the data directory: code %d\n%s\n%s", code, out, errOut)
	}
	empty := t.TempDir()
	out, errOut, code = sched(t, []string{"KILN_DATA_DIR=" + empty}, "datasets")
	if code != 0 || !strings.Contains(out, "no token stores in "+filepath.Join(empty, "tokens")+" yet") {
		t.Errorf("datasets with no stores: code %d\n%s\n%s", code, out, errOut)
	}

	local := "local:" + filepath.Join(data, "*.jsonl")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"no-such-dataset", "--store-dir", dir, "--tokenizer-file", tok}, `unknown dataset "no-such-dataset"`},
		{[]string{"fineweb-edu", "--store-dir", dir, "--tokenizer-file", tok, "--max-tokens", "lots"}, "--max-tokens"},
		// A flag of the whole command line is never a local one's double.
		{[]string{local, "--store", "s", "--tokenizer", tok}, "--tokenizer-file " + tok},
		{[]string{local, "--store", filepath.Join(stores, "x"), "--tokenizer-file", tok}, "--store-dir " + filepath.Join(stores, "x")},
		{[]string{local, "--store", "s", "--store-dir", dir, "--tokenizer-file", tok}, "not both"},
		{[]string{local, "--store", "s", "--tokenizer", "tk", "--tokenizer-file", tok}, "not both"},
		{[]string{local, "--store", "s"}, `tokenizer "mix-16384" is not known`},
		{[]string{local, "--tokenizer-file", tok}, "needs --store NAME"},
		{[]string{local, "--store-dir", tok, "--tokenizer-file", tok}, "--store-dir " + tok + " is a file, not a directory"},
		// A directory of other files is no place to make a store in.
		{[]string{local, "--store-dir", filepath.Dir(tok), "--tokenizer-file", tok}, "--store-dir " + filepath.Dir(tok) + " holds src and no token store (manifest.json)"},
	} {
		_, errOut, code := sched(t, nil, append([]string{"ingest", "--direct"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line with %q", c.args, code, errOut, c.want)
		}
	}
}

// Without --store-dir a direct ingest fills <data dir>/tokens/<store>, the
// store the queue fills and train reads, with the tokenizer --tokenizer
// names; the global --data-dir says where that is.
// An ingest whose files hold no text at all is an error of its input
// (exit 2, after the summary), not an empty store reported as done, and
// leaves no store behind (sched datasets would list it, bound to the
// tokenizer, holding nothing): run again, it says the same. A store that
// held those files as skipped before the run (an ingest through the queue
// made it) is not "already in the store" with the store empty either. A
// directory and a bad glob say how to name files.
func TestIngestDirectOfNoTextIsBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "empty.txt"), nil, 0o644)
	os.WriteFile(filepath.Join(src, "bin.txt"), []byte{0xff, 0xfe, 0x00, 0x81, 0xc3, 0x28}, 0o644)
	// A copy of it (the same content under another name) is passed over
	// as the same file, not skipped again: the store is this run's still.
	os.WriteFile(filepath.Join(src, "copy.txt"), []byte{0xff, 0xfe, 0x00, 0x81, 0xc3, 0x28}, 0o644)
	glob := "local:" + filepath.Join(src, "*")
	store := filepath.Join(data, "tokens", "code")
	ingestCode := func(dataset string) (string, int) {
		t.Helper()
		_, errOut, code := sched(t, nil, "ingest", dataset, "--direct", "--store", "code", "--tokenizer", "tk", "--data-dir", data)
		return errOut, code
	}
	noText := "none of its 3 files holds text to ingest (skipped: empty-file=1, invalid-utf8=1; the first: " + src
	for range 2 {
		if errOut, code := ingestCode(glob); code != 2 || !strings.Contains(errOut, noText) || strings.Contains(errOut, "rm -r") {
			t.Fatalf("ingest %s: exit %d, %q; want exit 2 and %q, and no store to delete", glob, code, errOut, noText)
		}
		if _, err := os.Stat(store); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a refused ingest left %s behind (%v)", store, err)
		}
	}
	// A store that records the files as skipped, as the pipeline leaves it.
	tok, err := tokenizer.Load(filepath.Join(data, "tokenizers", "tk", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := ingest.ResolvePreset(nil, glob, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := ingest.Direct(context.Background(), ingest.DirectOptions{Preset: p, Tokenizer: tok, TokenizerName: "tk", StoreDir: store, DataDir: data}); err != nil || len(rep.SkippedFiles) == 0 {
		t.Fatalf("the pipeline over files of no text: %+v, %v", rep, err)
	}
	if errOut, code := ingestCode(glob); code != 2 || !strings.Contains(errOut, "none of its 3 files holds text to ingest: token store "+store+
		" holds no tokens and records its files as skipped by an earlier run (empty-file=1, invalid-utf8=1; the first: "+src) {
		t.Fatalf("ingest into a store that holds its files as skipped: exit %d, %q", code, errOut)
	}
	for _, c := range []struct {
		dataset string
		want    string
	}{
		{"local:" + src, "is a directory: name its files with a glob, such as local:" + filepath.Join(src, "*")},
		{"local:" + filepath.Join(src, "["), `write a literal [ as \[`},
	} {
		if errOut, code := ingestCode(c.dataset); code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("ingest %s: exit %d, %q; want exit 2 and %q", c.dataset, code, errOut, c.want)
		}
	}
}

// A JSON lines file whose text is in another field than "text" gives an
// ingest of no text; its message says to name the field with --columns,
// and the same files with the right --columns are then ingested into the
// store the first run made, which no longer records them as skipped.
// Before, that store had to be deleted first: it held the files as
// skipped, and the ingest with --columns passed over them.
func TestIngestDirectWithTheWrongFieldSaysHowToIngestAgain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "a.jsonl"), []byte(`{"content":"package main"}`+"\n"+`{"content":"func f() {}"}`+"\n"), 0o644)
	store := filepath.Join(data, "tokens", "code")
	args := []string{"ingest", "local:" + filepath.Join(src, "*.jsonl"), "--direct", "--store", "code", "--tokenizer", "tk", "--data-dir", data}
	_, errOut, code := sched(t, nil, args...)
	if want := `--columns text=<name> where their text is in another column or field than "text"`; code != 2 || !strings.Contains(errOut, want) || strings.Contains(errOut, "rm -r") {
		t.Fatalf("ingest of the wrong field: exit %d, %q; want exit 2 and %q, and no store to delete", code, errOut, want)
	}
	out, errOut, code := sched(t, nil, append(args, "--columns", "text=content")...)
	if code != 0 || !strings.Contains(out, "1 files, 1 appended (2 documents") {
		t.Fatalf("ingest with --columns text=content into the store of the first: exit %d\n%s%s", code, out, errOut)
	}
	m, err := tokens.ReadManifest(store)
	if err != nil {
		t.Fatal(err)
	}
	if m.Tokens == 0 || len(m.Skipped) != 0 {
		t.Errorf("the store after the ingest with --columns: %d tokens, skipped %+v; want the file's tokens and no record of it skipped", m.Tokens, m.Skipped)
	}
}

func TestIngestDirectIntoTheDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	src := sourceDir(t, dir, twoFiles)
	// A second path to a's bytes: one shard holds both, and the report
	// says so rather than counting it as already in the new store.
	os.WriteFile(filepath.Join(src, "c.jsonl"), []byte(`{"text":"package main"}`+"\n"+`{"text":"func f() {}"}`+"\n"), 0o644)
	out, errOut, code := sched(t, nil, "ingest", "local:"+filepath.Join(src, "*.jsonl"), "--direct", "--store", "code",
		"--tokenizer", "tk", "--data-dir", data)
	if code != 0 || !strings.Contains(out, "3 files, 2 appended (3 documents") ||
		!strings.Contains(out, "0 already in the store, 1 with the same content as another file") {
		t.Fatalf("ingest: exit %d\n%s%s", code, out, errOut)
	}
	m, err := tokens.ReadManifest(filepath.Join(data, "tokens", "code"))
	if err != nil || m.Documents != 3 || m.Tokenizer.Name != "tk" {
		t.Fatalf("store: %+v, %v; want 3 documents made by tokenizer tk", m, err)
	}
	out, _, code = sched(t, nil, "ingest", "local:"+filepath.Join(src, "*.jsonl"), "--direct", "--store", "code",
		"--tokenizer", "tk", "--data-dir", data)
	if code != 0 || !strings.Contains(out, "0 appended") || !strings.Contains(out, "3 already in the store\n") {
		t.Fatalf("second ingest: exit %d\n%s", code, out)
	}
	// A limit the store already passes: a stop, not a failure, that says
	// why in one line, with no files counted; and again at that limit once
	// an append has refused a file (the store's mark beside it).
	os.WriteFile(filepath.Join(src, "d.jsonl"), []byte(`{"text":"func h() { return }"}`+"\n"), 0o644)
	limit := strconv.FormatInt(m.Tokens+1, 10)
	for _, want := range []string{"stopped before", "is full at --max-tokens " + limit} {
		out, errOut, code = sched(t, nil, "ingest", "local:"+filepath.Join(src, "*.jsonl"), "--direct", "--store", "code",
			"--tokenizer", "tk", "--data-dir", data, "--max-tokens", limit)
		if code != 0 || !strings.Contains(out, want) || (want != "stopped before" && strings.Contains(out, " files, ")) {
			t.Fatalf("ingest at --max-tokens %s: exit %d, want %q\n%s%s", limit, code, want, out, errOut)
		}
	}
}

// `sched ingest` without --direct queues a plan that `sched worker` carries
// through shards and appends into <data dir>/tokens/<store>; mistakes are
// refused before anything is queued.
// tokenizerTK writes goldenTokenizerWithEOS's tokenizer in dir, and
// as tokenizer tk of the data directory data's catalog; it returns the
// file in dir.
func tokenizerTK(t *testing.T, dir, data string) string {
	t.Helper()
	tokFile := goldenTokenizerWithEOS(t, dir)
	b, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(data, "tokenizers", "tk"), 0o755)
	if err := os.WriteFile(filepath.Join(data, "tokenizers", "tk", "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return tokFile
}

func TestIngestThroughTheQueueFromTheCLI(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "kiln")
	// A tokenizer this machine holds in its catalog directory, by name.
	tokFile := tokenizerTK(t, dir, data)
	src := sourceDir(t, dir, twoFiles)
	// The files are outside the data directory: the worker reads them
	// only because they are under one of its local roots.
	redis := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + redis.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src}
	glob := "local:" + filepath.Join(src, "*.jsonl")

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ingest", glob, "--tokenizer", "tk"}, "needs --store"},
		{[]string{"ingest", "no-such-dataset", "--store", "s"}, `unknown dataset "no-such-dataset"`},
		{[]string{"ingest", glob, "--store", "a/b"}, "--store-dir a/b"},
		{[]string{"ingest", glob, "--store", "s", "--tokenizer", "tk", "--store-dir", dir}, "--store-dir is for --direct"},
		{[]string{"ingest", glob, "--store", "s", "--tokenizer-file", tokFile}, "--tokenizer-file is for --direct"},
		{[]string{"ingest", glob, "--store", "s", "--tokenizer", tokFile}, "--tokenizer-file " + tokFile},
		{[]string{"ingest", glob, "--store", "s", "--max-disk", "big"}, "--max-disk"},
		{[]string{"ingest", glob, "--store", "s", "--max-files", "-1"}, "--max-files -1: give how many files"},
	} {
		_, errOut, code := sched(t, env, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Fatalf("%v: code %d, %q; want exit 2 and one line with %q", c.args, code, errOut, c.want)
		}
	}

	out, errOut, code := sched(t, env, "ingest", glob, "--store", "code", "--tokenizer", "tk", "--max-tokens", "1M")
	if code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Fatalf("ingest: code %d\n%s\n%s", code, out, errOut)
	}
	out, _, code = sched(t, env, "ingest", glob, "--store", "code", "--tokenizer", "tk", "--max-tokens", "1M")
	if code != 0 || !strings.Contains(out, "already queued") {
		t.Fatalf("second ingest: code %d\n%s", code, out)
	}
	startWorker(t, env, "--queues", "ingest=1,append=1")
	if m := waitForStore(t, redis.Addr, filepath.Join(data, "tokens", "code"), 2); m.Documents != 3 {
		t.Fatalf("the store holds %d documents, want 3", m.Documents)
	}
	out, _, code = sched(t, env, "datasets", "--stores", filepath.Join(data, "tokens"))
	if code != 0 || !strings.Contains(out, "code") {
		t.Fatalf("datasets: code %d\n%s", code, out)
	}
	// Another tokenizer's ingest into the store is refused at once.
	other, _ := trainTestTokenizer(t, "SELECT name FROM users WHERE id = 1;\n")
	b, _ := os.ReadFile(other)
	os.MkdirAll(filepath.Join(data, "tokenizers", "tk2"), 0o755)
	os.WriteFile(filepath.Join(data, "tokenizers", "tk2", "tokenizer.json"), b, 0o644)
	out, errOut, code = sched(t, env, "ingest", glob, "--store", "code", "--tokenizer", "tk2")
	if code != 2 || !strings.Contains(errOut, "token store code was written with tokenizer tk ") || !strings.Contains(errOut, "not tk2") {
		t.Fatalf("ingest into store code of tokenizer tk with tokenizer tk2: exit %d\n%s%s; want exit 2 naming both", code, out, errOut)
	}
}

func TestParseCountAndBytes(t *testing.T) {
	if n, _ := parseCount("25B"); n != 25_000_000_000 {
		t.Fatalf("25B = %d", n)
	}
	for s, want := range map[string]int64{"1.5K": 1500, "1.1K": 1100, "0.29K": 290, "2.3M": 2_300_000, "1e3": 1000, "7": 7} {
		if n, err := parseCount(s); n != want || err != nil {
			t.Errorf("parseCount(%q) = %d, %v; want %d", s, n, err, want)
		}
	}
	// A fraction of a token is a mistake, not a count to round.
	for _, bad := range []string{"1.5", "0.0005K", "1.0000000001M"} {
		if n, err := parseCount(bad); err == nil || !strings.Contains(err.Error(), "not a whole number") {
			t.Errorf("parseCount(%q) = %d, %v; want a refusal", bad, n, err)
		}
	}
	if n, _ := parseBytes("50GiB"); n != 50<<30 {
		t.Fatalf("50GiB = %d", n)
	}
	if n, _ := parseBytes("512M"); n != 512<<20 {
		t.Fatalf("512M = %d", n)
	}
	// None of these may read as a size, least of all as 0 or a negative
	// number, which mean no limit.
	for _, bad := range []string{"NaN", "nan", "Inf", "-Inf", "1e30T", "9.3e18", "-1"} {
		if n, err := parseCount(bad); err == nil {
			t.Errorf("parseCount(%q) = %d", bad, n)
		}
		if n, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) = %d", bad, n)
		}
	}
}

// dataDirWithTokenizer makes dir/kiln, a data directory that holds
// goldenTokenizerWithEOS's tokenizer under name, and returns its path.
func dataDirWithTokenizer(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(goldenTokenizerWithEOS(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "kiln")
	if err := os.MkdirAll(filepath.Join(data, "tokenizers", name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "tokenizers", name, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return data
}

// sourceDir writes files (name to text) into dir/src, a local dataset's
// directory, and returns its path.
func sourceDir(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// twoFiles are a local dataset of two JSON lines files, three documents.
var twoFiles = map[string]string{
	"a.jsonl": `{"text":"package main"}` + "\n" + `{"text":"func f() {}"}` + "\n",
	"b.jsonl": `{"text":"func g() {}"}` + "\n",
}

// goldenTokenizerWithEOS trains a small tokenizer (with <|endoftext|>) into dir.
func goldenTokenizerWithEOS(t *testing.T, dir string) string {
	t.Helper()
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("package main\nfunc f() {}\n", 100))}, tokenizer.TrainOptions{VocabSize: 280})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tok.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// sched datasets check takes --presets (KILN_DATASETS's flag) and the
// Hugging Face token of --hf-token (or the config file's) over HF_TOKEN's,
// as an ingest does: a gated preset of the project's hub server checks with
// the flag's token and is refused with the environment's.
func TestDatasetsCheckTakesPresetsAndTheConfiguredToken(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Gated, hub.Authorized = true, "hf_flag"
	hub.Add("org/gated", "data/a.jsonl", []byte(`{"text":"package main"}`+"\n"), false)
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("mine:\n  repo: org/gated\n  revision: main\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	env := []string{"HF_ENDPOINT=" + hub.Server.URL, "HF_TOKEN=hf_env"}
	out, errOut, code := sched(t, env, "datasets", "check", "mine", "--presets", presets, "--hf-token", "hf_flag")
	if code != 0 || !strings.HasPrefix(out, "mine: org/gated at commit ") {
		t.Errorf("check with --hf-token: code %d\n%s\n%s", code, out, errOut)
	}
	if _, errOut, code := sched(t, env, "datasets", "check", "mine", "--presets", presets); code == 0 || !strings.Contains(errOut, "org/gated") {
		t.Errorf("check with HF_TOKEN's token, which the hub refuses: code %d, %q", code, errOut)
	}
	var seen []string
	for _, r := range hub.Requests() {
		seen = append(seen, r.Authorization)
	}
	if !slices.Contains(seen, "Bearer hf_flag") || !slices.Contains(seen, "Bearer hf_env") || slices.Contains(seen, "") {
		t.Errorf("the hub saw the tokens %q; want the flag's, then the environment's", seen)
	}
	// --hf-token "" is no token, over HF_TOKEN's and its older name's, as
	// sched config shows it.
	asked := len(hub.Requests())
	for _, env := range [][]string{env, {"HF_ENDPOINT=" + hub.Server.URL, "HUGGING_FACE_HUB_TOKEN=hf_env"}} {
		if _, errOut, code := sched(t, env, "datasets", "check", "mine", "--presets", presets, "--hf-token", ""); code == 0 || !strings.Contains(errOut, "org/gated") {
			t.Errorf("%v check with --hf-token \"\": code %d, %q; want the gated dataset refused", env, code, errOut)
		}
	}
	for _, r := range hub.Requests()[asked:] {
		if r.Authorization != "" {
			t.Errorf("with --hf-token \"\", the hub was asked with %q", r.Authorization)
		}
	}
}

// sched datasets check says each wait of a hub that does not answer as it
// starts, where it was silent for up to a minute, and checks once the hub
// answers.
func TestDatasetsCheckSaysItsRetries(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Add("org/code", "data/a.jsonl", []byte(`{"text":"x = 1"}`+"\n"), false)
	hub.SetUnavailable(2, 0)
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("code:\n  repo: org/code\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	out, errOut, code := sched(t, []string{"HF_ENDPOINT=" + hub.Server.URL}, "datasets", "check", "code", "--presets", presets)
	if code != 0 || !strings.Contains(out, ": 1 file,") {
		t.Fatalf("check after two 503s: exit %d\n%s%s", code, out, errOut)
	}
	if n := strings.Count(errOut, "trying again in"); n != 2 {
		t.Errorf("check after two 503s said %d waits, want 2:\n%s", n, errOut)
	}
}

// sched datasets check of a gated dataset whose files the hub lists to
// everyone, with a token the hub refuses, says that the hub refused it,
// not that the file is not readable parquet.
func TestDatasetsCheckOfARefusedFileSaysTheHubRefusedIt(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Gated, hub.PublicListing, hub.Authorized = true, true, "hf_good"
	type row struct {
		Text string `parquet:"text"`
	}
	hub.Add("org/gated", "data/train-0.parquet", writeParquet(t, []row{{Text: "package main"}}), true)
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("gated:\n  repo: org/gated\n  include: [\"data/*.parquet\"]\n"), 0o644)
	env := []string{"HF_ENDPOINT=" + hub.Server.URL}
	if out, errOut, code := sched(t, env, "datasets", "check", "gated", "--presets", presets, "--hf-token", "hf_good"); code != 0 {
		t.Fatalf("check with the token the hub takes: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code := sched(t, env, "datasets", "check", "gated", "--presets", presets, "--hf-token", "hf_other")
	if code != 2 || !strings.Contains(errOut, "dataset gated: reading data/train-0.parquet: ") || !strings.Contains(errOut, "gated") || strings.Contains(errOut, "not readable parquet") {
		t.Errorf("check with a token the hub refuses: exit %d, %q; want exit 2, the hub's refusal, and no word of the file's format", code, errOut)
	}
}

// sched datasets check --revision of a revision the dataset lacks names
// the flag, as an ingest does, where it said to check the preset's.
func TestDatasetsCheckNamesTheRevisionFlag(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Add("org/code", "data/a.jsonl", []byte(`{"text":"x = 1"}`+"\n"), false)
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("code:\n  repo: org/code\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	_, errOut, code := sched(t, []string{"HF_ENDPOINT=" + hub.Server.URL}, "datasets", "check", "code", "--presets", presets, "--revision", "nosuchrev")
	if want := "has no revision nosuchrev, which --revision names (RevisionNotFound): set --revision to a branch, tag or commit"; code != 2 || !strings.Contains(errOut, want) {
		t.Errorf("check --revision nosuchrev: exit %d, %q; want exit 2 and %q", code, errOut, want)
	}
}

// sched datasets check takes --set as an ingest does, and a value that
// matches no file exits 2 naming it, where the values that match check.
func TestDatasetsCheckTakesSetAndNamesAValueThatMatchesNoFile(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	for _, lang := range []string{"Python", "Go"} {
		hub.Add("org/code", "data/"+lang+"/a.jsonl", []byte(`{"text":"x = 1"}`+"\n"), false)
	}
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("code:\n  repo: org/code\n  include: [\"data/{language}/*.jsonl\"]\n  vars: {language: [\"*\"]}\n"), 0o644)
	env := []string{"HF_ENDPOINT=" + hub.Server.URL}
	if out, errOut, code := sched(t, env, "datasets", "check", "code", "--presets", presets, "--set", "language=Go"); code != 0 || !strings.Contains(out, ": 1 file,") {
		t.Errorf("check --set language=Go: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code := sched(t, env, "datasets", "check", "code", "--presets", presets, "--set", "language=Python,Golang")
	if code != 2 || !strings.Contains(errOut, "language=Golang matched no file (data/Golang/*.jsonl; the other values match 1)") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("check --set language=Python,Golang: exit %d, %q; want exit 2 and one line naming language=Golang", code, errOut)
	}
}

// A local dataset whose text is in a field other than "text" is read with
// --columns: the check and the direct ingest without it exit 2 saying so,
// with it they read the field, and a queued ingest carries the columns to
// the worker, whose own presets know nothing of them.
func TestLocalDatasetReadsTheColumnsOfColumns(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "kiln")
	tokenizerTK(t, dir, data)
	src := filepath.Join(data, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "a.jsonl"), []byte(`{"content":"package main","path":"a.go"}`+"\n"+`{"content":"func f() {}","path":"b.go"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(src, "b.jsonl"), []byte(`{"content":"func g() {}","path":"c.go"}`+"\n"), 0o644)
	glob := "local:" + filepath.Join(src, "*.jsonl")
	env := []string{"KILN_DATA_DIR=" + data}

	if _, errOut, code := sched(t, env, "datasets", "check", glob); code != 2 || !strings.Contains(errOut, "--columns text=<name>") {
		t.Errorf("check without --columns: exit %d, %q; want exit 2 naming --columns", code, errOut)
	}
	if out, errOut, code := sched(t, env, "datasets", "check", glob, "--columns", "text=content,id=path"); code != 0 || !strings.Contains(out, `field "content"`) {
		t.Errorf("check --columns text=content: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code := sched(t, env, "datasets", "check", glob, "--columns", "body"); code != 2 || !strings.Contains(errOut, "--columns \"body\": want key=column") {
		t.Errorf("check --columns body: exit %d, %q; want exit 2 saying the form", code, errOut)
	}
	direct := filepath.Join(dir, "direct")
	if _, errOut, code := sched(t, env, "ingest", glob, "--direct", "--store-dir", direct, "--tokenizer", "tk"); code != 2 || !strings.Contains(errOut, `--columns text=<name> where their text is in another column or field than "text"`) {
		t.Errorf("ingest --direct without --columns: exit %d, %q; want exit 2 naming --columns", code, errOut)
	}
	if out, errOut, code := sched(t, env, "ingest", glob, "--direct", "--store-dir", filepath.Join(dir, "direct2"), "--tokenizer", "tk", "--columns", "text=content"); code != 0 || !strings.Contains(out, "2 appended (3 documents") {
		t.Errorf("ingest --direct --columns text=content: exit %d\n%s%s", code, out, errOut)
	}

	redis := testsvc.StartRedis(t)
	env = append(env, "KILN_REDIS_URL="+redis.URL(0))
	if out, errOut, code := sched(t, env, "enqueue", "ingest", glob, "--store", "code", "--tokenizer", "tk", "--columns", "text=content"); code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Fatalf("enqueue ingest --columns text=content: exit %d\n%s%s", code, out, errOut)
	}
	startWorker(t, env, "--queues", "ingest=1,append=1")
	if m := waitForStore(t, redis.Addr, filepath.Join(data, "tokens", "code"), 2); m.Documents != 3 || len(m.Skipped) != 0 {
		t.Fatalf("the queued ingest's store holds %d documents and skipped %+v; want the 3 of the field content", m.Documents, m.Skipped)
	}
}

// A dataset of the user's presets file (--presets here, KILN_DATASETS
// alike) is ingested by a worker that has no copy of the file: the plan
// carries the preset as the command resolved it. Before, the worker looked
// the name up in its own presets and archived the plan as an unknown
// dataset.
func TestQueuedIngestCarriesThePresetOfThePresetsFile(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "kiln")
	tokenizerTK(t, dir, data)
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Add("org/mine", "data/a.jsonl", []byte(`{"body":"package main"}`+"\n"+`{"body":"func f() {}"}`+"\n"), false)
	hub.Add("org/mine", "data/b.jsonl", []byte(`{"body":"func g() {}"}`+"\n"), false)
	hub.Add("org/mine", "other/c.jsonl", []byte(`{"body":"not this one"}`+"\n"), false)
	presets := filepath.Join(dir, "presets.yaml")
	os.WriteFile(presets, []byte("mine:\n  repo: org/mine\n  revision: main\n  include: [\"data/*.jsonl\"]\n  columns: {text: body}\n"), 0o644)
	redis := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + redis.URL(0), "KILN_DATA_DIR=" + data, "HF_ENDPOINT=" + hub.Server.URL}

	if out, errOut, code := sched(t, env, "enqueue", "ingest", "mine", "--presets", presets, "--tokenizer", "tk"); code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Fatalf("enqueue ingest mine --presets: exit %d\n%s%s", code, out, errOut)
	}
	// The worker's environment names no presets file.
	startWorker(t, env, "--queues", "ingest=1,append=1")
	if m := waitForStore(t, redis.Addr, filepath.Join(data, "tokens", "mine"), 2); m.Documents != 3 {
		t.Fatalf("the store holds %d documents, want the 3 of data/*.jsonl", m.Documents)
	}
}

// waitForStore waits until the store at dir holds shards shards and returns
// its manifest; an ingest or append task the worker archives (one that
// failed for good) ends the wait at once, with its error.
func waitForStore(t *testing.T, redisAddr, dir string, shards int) *tokens.Manifest {
	t.Helper()
	inspector := asynq.NewInspector(asynq.RedisClientOpt{Addr: redisAddr})
	defer inspector.Close()
	for {
		if m, err := tokens.ReadManifest(dir); err == nil && len(m.Shards) == shards {
			return m
		}
		for _, q := range []string{"ingest", "append"} {
			if archived, _ := inspector.ListArchivedTasks(q); len(archived) > 0 {
				t.Fatalf("the worker archived %s: %s", archived[0].ID, archived[0].LastErr)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A --stores that does not read is refused before anything is printed: a
// script gets the error, not half a listing.
func TestDatasetsRefusesAStoresDirThatDoesNotRead(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "none")
	out, errOut, code := sched(t, nil, "datasets", "--stores", missing)
	if code != 2 || out != "" || !strings.Contains(errOut, "--stores "+missing) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2, nothing printed, and the error naming --stores", code, out, errOut)
	}
}

// A queued ingest's local glob is resolved by the worker, in its own
// working directory: a relative one is refused at enqueue (for a
// tokenizer's --from as for an ingest), saying to give the absolute path
// as the worker sees it, and nothing is queued. An absolute glob, which
// only the worker can check, is queued. --revision with a local dataset,
// which has none, is refused queued and direct alike.
func TestIngestRefusesARelativeQueuedGlobAndALocalRevision(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	redis := testsvc.Redis(t)
	env := []string{"KILN_REDIS_URL=redis://" + redis + "/0", "KILN_DATA_DIR=" + data, "KILN_TOKENIZER=tk"}
	abs := "local:" + filepath.Join(dir, "on-the-worker", "*.go")
	noRevision := []string{"--revision v1", "a local dataset (" + abs + ") has no revision", "leave --revision out"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"enqueue", "ingest", "local:.kiln/src/*.go", "--store", "code"}, []string{"dataset local:.kiln/src/*.go", "working directory", "give the absolute path as the worker sees it"}},
		{[]string{"ingest", "local:src/*.go", "--store", "code"}, []string{"dataset local:src/*.go", "give the absolute path as the worker sees it"}},
		{[]string{"enqueue", "tokenizer", "t", "--from", "local:src/*.go=1"}, []string{"--from: dataset local:src/*.go", "give the absolute path as the worker sees it"}},
		{[]string{"enqueue", "ingest", abs, "--store", "code", "--revision", "v1"}, noRevision},
		{[]string{"ingest", abs, "--direct", "--store", "code", "--revision", "v1"}, noRevision},
	} {
		_, errOut, code := sched(t, env, c.args...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line", c.args, code, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: %q lacks %q", c.args, errOut, w)
			}
		}
	}
	opt, _ := asynq.ParseRedisURI("redis://" + redis + "/0")
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	if ts, _ := insp.ListPendingTasks(scheduler.QueueIngest); len(ts) != 0 {
		t.Fatalf("refused requests queued %d tasks", len(ts))
	}
	if out, errOut, code := sched(t, env, "enqueue", "ingest", abs, "--store", "code"); code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Fatalf("enqueue ingest %s: exit %d\n%s%s; want it queued for the worker to read", abs, code, out, errOut)
	}
}
