package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// A flag name means one thing on every command: no command declares a flag
// of its own under the name of one of the root's persistent flags, which
// would shadow the global one there and make it mean something else.
func TestNoFlagShadowsAGlobalFlag(t *testing.T) {
	global := map[string]bool{}
	rootCmd.PersistentFlags().VisitAll(func(f *pflag.Flag) { global[f.Name] = true })
	if !global["config"] || !global["tokenizer"] || !global["data-dir"] {
		t.Fatalf("the root's persistent flags are %v: the walk below would check nothing", global)
	}
	commands := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		commands++
		for _, fs := range []*pflag.FlagSet{c.LocalNonPersistentFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				if c != rootCmd && global[f.Name] {
					t.Errorf("'%s' declares --%s, a global flag's name: name its own flag otherwise", c.CommandPath(), f.Name)
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd)
	if commands < 20 {
		t.Fatalf("walked %d commands; the tree has more", commands)
	}
}

// sched runs --presets lists the runs sched enqueue train takes, those of
// KILN_RUNS's file among them, without Redis; a runs file that does not
// read is refused naming it.
func TestRunsPresetsListsTheRuns(t *testing.T) {
	t.Parallel()
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	out, errOut, code := sched(t, []string{noRedis}, "runs", "--presets")
	for _, want := range []string{"pilot      small  2.0G tok (15259 steps)    8x1024x16  mix-16384  auto", "long ", "demo ", "pilot-cpu "} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("runs --presets: exit %d, no %q in\n%s%s", code, want, out, errOut)
		}
	}
	file := filepath.Join(t.TempDir(), "runs.yaml")
	os.WriteFile(file, []byte("mine:\n  from: pilot\n  description: my own\n  total_tokens: 1000000000\n"), 0o644)
	out, errOut, code = sched(t, []string{noRedis, "KILN_RUNS=" + file}, "runs", "--presets")
	if line := lineOf(out, "mine "); code != 0 || !strings.Contains(line, "small  1.0G tok (7630 steps)") || !strings.HasSuffix(line, "my own") {
		t.Errorf("runs --presets with KILN_RUNS: exit %d, line %q\n%s%s", code, line, out, errOut)
	}
	// A file after --presets, as sched ingest's takes one, says how a
	// runs file is named.
	wantRefused(t, []string{noRedis}, "sched runs --presets takes no file: it lists the presets and the runs of the file KILN_RUNS names; to list those of "+file+", run KILN_RUNS="+file+" sched runs --presets", "runs", "--presets", file)
	os.WriteFile(file, []byte("mine: [\n"), 0o644)
	if _, errOut, code := sched(t, []string{noRedis, "KILN_RUNS=" + file}, "runs", "--presets"); code != 2 || !strings.Contains(errOut, file) {
		t.Errorf("a runs file that does not read: exit %d, %q", code, errOut)
	}
}

// Wrong arguments are bad input on every command: one line that names the
// command, exit 2. cobra's own checks returned plain errors (exit 1), and a
// command that only groups others printed its help and exited 0 for a name
// it does not know.
func TestWrongArgumentsExitTwoOnEveryCommand(t *testing.T) {
	t.Parallel()
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	var leaves []*cobra.Command
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		// cobra's own help and completion, added to the tree when it
		// first runs, are cobra's to answer.
		if c.HasParent() && !c.HasSubCommands() && c.Name() != "help" && !strings.Contains(c.CommandPath(), " completion") {
			leaves = append(leaves, c)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd)
	if len(leaves) < 20 {
		t.Fatalf("walked %d commands; the tree has more", len(leaves))
	}
	for _, c := range leaves {
		path := strings.Fields(c.CommandPath())[1:]
		args := append(path, "a1", "a2", "a3", "a4", "a5")
		out, errOut, code := sched(t, []string{noRedis}, args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 2 || len(lines) != 1 || !strings.Contains(errOut, c.CommandPath()) && !strings.Contains(errOut, c.Name()) || out != "" {
			t.Errorf("sched %s: exit %d, stdout %q, stderr %q; want exit 2 and one line naming the command", strings.Join(args, " "), code, out, errOut)
		}
	}
	for _, tc := range []struct{ args, want string }{
		{"tokenizer trian", `unknown command "trian" for 'sched tokenizer': did you mean train?`},
		{"tokenizer bogus", `unknown command "bogus" for 'sched tokenizer': use train`},
		{"datasets chek", `unknown command "chek" for 'sched datasets': did you mean check?`},
		{"enqueue ingets x", `unknown command "ingets" for 'sched enqueue': did you mean ingest?`},
		{"completion foo", `unknown command "foo" for 'sched completion': use bash`},
		{"bogus", `unknown command "bogus" for 'sched' (see 'sched --help')`},
		{"statsu", `unknown command "statsu" for 'sched': did you mean status? (see 'sched --help')`},
		{"help a b", `no help topic "a b": 'sched help' takes a command's name`},
		{"help tokenizer trian", `unknown command "trian" for 'sched tokenizer': did you mean train?`},
		{"help status now", `no help topic "now" under 'sched status'`},
		// A command of no arguments and no subcommands says so, not that
		// the word is an unknown command of its.
		{"bench extra", `sched bench expects no arguments (got 1: ["extra"])`},
		{"generate extra", `sched generate expects no arguments`},
		{"verify extra", `sched verify expects no arguments`},
	} {
		out, errOut, code := sched(t, []string{noRedis}, strings.Fields(tc.args)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("sched %s: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
	for _, args := range []string{"help", "help tokenizer train", "help status"} {
		if out, errOut, code := sched(t, []string{noRedis}, strings.Fields(args)...); code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("sched %s: exit %d, stdout %q, stderr %q; want the help", args, code, out, errOut)
		}
	}
	// With no name, a group prints its help.
	if out, errOut, code := sched(t, []string{noRedis}, "tokenizer"); code != 0 || !strings.Contains(out, "sched tokenizer [command]") {
		t.Errorf("sched tokenizer: exit %d, stdout %q, stderr %q; want its help", code, out, errOut)
	}
}

// A flag given empty, where empty is no setting of its own, is refused
// naming the flag, instead of meaning the default over the environment's
// value; the flags whose empty value means something still take it.
func TestAFlagGivenEmptyIsRefused(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "mine")
	env := []string{"KILN_DATA_DIR=" + data, "KILN_TOKENIZER=mix-4096", "KILN_METRICS_ADDR=:9400"}
	for _, args := range [][]string{{"--redis-url", ""}, {"--data-dir", ""}, {"--tokenizer", ""}, {"--s3-bucket", ""}, {"--local-roots", ""},
		{"--log-format", ""}, {"--shutdown-grace", ""}, {"--s3-secure="}, {"--data-dir="}} {
		flag, _, _ := strings.Cut(args[0], "=")
		out, errOut, code := sched(t, env, append([]string{"config"}, args...)...)
		if code != 2 || !strings.Contains(errOut, "flag "+flag+" is given empty") {
			t.Errorf("config %q: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	out, errOut, code := sched(t, env, "config", "--metrics-addr", "", "--s3-endpoint", "", "--hf-token", "")
	if code != 0 || !regexp.MustCompile(`(?m)^KILN_METRICS_ADDR\s+metrics-addr\s*$`).MatchString(out) || !strings.Contains(out, data) {
		t.Errorf("config with the flags whose empty value means something: exit %d\n%s%s", code, out, errOut)
	}
}
