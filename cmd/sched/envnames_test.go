package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func init() {
	// TestMain's switch that makes this binary sched: set on every
	// command the tests run, and no user's to be warned of.
	harnessVariables = append(harnessVariables, "KILN_SCHED_EXEC")
}

// A mistyped variable's name (KILN_REDIS_ULR, KILN_CUDA_GRPAH) was ignored
// without a word, its setting left at the default; README said of the
// KILN_CUDA_* variables that every command refuses a mistyped one, which
// held of a mistyped value only. Every command now warns, once, on stderr,
// of each KILN_* variable it does not read, naming the one it most likely
// meant, and goes on; the warning comes before any error, which it may
// explain.
func TestEveryCommandWarnsOfAKILNVariableItDoesNotRead(t *testing.T) {
	t.Parallel()
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	typos := []string{noRedis, "KILN_REDIS_ULR=redis://127.0.0.1:2/0", "KILN_CUDA_GRPAH=off", "KILN_NOSUCH=1", "kiln_tokenizer=tk"}
	warnings := "warning: KILN_CUDA_GRPAH is not a variable kiln reads: did you mean KILN_CUDA_GRAPH?\n" +
		`warning: KILN_NOSUCH is not a variable kiln reads (README.md's Configuration lists those it does, docs/operations.md's "GPU engine settings" the KILN_CUDA_* ones); it is ignored` + "\n" +
		"warning: KILN_REDIS_ULR is not a variable kiln reads: did you mean KILN_REDIS_URL?\n" +
		"warning: kiln_tokenizer is not a variable kiln reads: did you mean KILN_TOKENIZER?\n"
	for _, c := range []struct {
		args []string
		code int
		// then is what stderr holds after the warnings.
		then string
	}{
		{[]string{"version"}, 0, ""},
		{[]string{"config"}, 0, ""},
		{[]string{"runs", "--presets"}, 0, ""},
		{[]string{"status"}, exitBadInput, "sched: cannot reach Redis at redis://127.0.0.1:1/0 (KILN_REDIS_URL or --redis-url): "},
		{[]string{"cancel"}, exitBadInput, "sched: sched cancel expects one task id"},
	} {
		_, errOut, code := sched(t, typos, c.args...)
		if code != c.code || !strings.HasPrefix(errOut, warnings+c.then) || (c.then == "" && errOut != warnings) {
			t.Errorf("sched %v with mistyped variables: exit %d, stderr:\n%s\nwant exit %d, and stderr\n%s%s...", c.args, code, errOut, c.code, warnings, c.then)
		}
	}
	// Each variable kiln reads, set, warns of nothing.
	var env []string
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for name := range kilnVariables() {
			if !yield(name) {
				return
			}
		}
	}) {
		env = append(env, name+"=")
	}
	env = append(env, composeVariables...)
	for i, name := range composeVariables {
		env[len(env)-len(composeVariables)+i] = name + "=x"
	}
	if out, errOut, code := sched(t, append(env, noRedis), "version"); code != 0 || errOut != "" {
		t.Errorf("sched version with every variable kiln reads set (empty), and compose's: exit %d, stderr %q\n%s", code, errOut, out)
	}
}

// The variables kiln reads are gathered from where each is read. Every one
// that README.md, docs/operations.md, compose.yaml, .env.example and the
// Dockerfile name, and every one a Go file of kiln names, is among them:
// one read or documented and not known here would be warned of as a
// mistake. The tests' and benchmarks' own (KILN_TEST_*, in
// docs/benchmarks.md) are go test's, not sched's.
func TestTheVariablesKilnReadsAreTheOnesItDocumentsAndReads(t *testing.T) {
	t.Parallel()
	known := kilnVariables()
	for _, v := range composeVariables {
		known[v] = true
	}
	name := regexp.MustCompile(`\bKILN_[A-Z0-9_]*[A-Z0-9]\b`)
	for _, doc := range []string{"README.md", "docs/operations.md", "compose.yaml", ".env.example", "Dockerfile"} {
		b, err := os.ReadFile(filepath.Join("../..", doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range name.FindAllString(string(b), -1) {
			if !known[v] {
				t.Errorf("%s names %s, which sched would warn of as a variable it does not read", doc, v)
			}
		}
	}
	err := filepath.WalkDir("../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "../.." {
			return filepath.SkipDir
		}
		// This command's own file names mistyped names as examples.
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || path == "../../cmd/sched/envnames.go" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, v := range name.FindAllString(string(b), -1) {
			if !known[v] {
				t.Errorf("%s names %s, which sched would warn of as a variable it does not read", path, v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// And the closest known name is the one meant.
	for typo, want := range map[string]string{
		"KILN_REDIS_ULR": "KILN_REDIS_URL", "KILN_CUDA_GRPAH": "KILN_CUDA_GRAPH", "KILN_S3_SECRET": "KILN_S3_SECRET_KEY",
		"KILN_GPU": "KILN_GPUS", "kiln_runs": "KILN_RUNS", "KILN_NOSUCH": "", "KILN_SCHED": "",
	} {
		var b bytes.Buffer
		warnUnknownVariables(&b, []string{typo + "=1"})
		if got := nearestName(typo, sortedKeys(kilnVariables())); got != want {
			t.Errorf("%s: nearest known name %q, want %q (%s)", typo, got, want, b.String())
		}
	}
}
