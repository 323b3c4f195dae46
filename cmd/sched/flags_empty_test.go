package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A command's own flag given empty, where empty is no setting of its own,
// is refused naming the flag, as the global flags are: it meant the
// default unnoticed, over KILN_DATASETS's file and KILN_TOKENIZER too (an
// unset shell variable in --presets "$FILE"). Each is refused before the
// command reads anything: the demo cases would otherwise refuse --engine
// bogus, and the others read the default they fell back to.
func TestCommandFlagsGivenEmptyAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	text := filepath.Join(dir, "hi.txt")
	if err := os.WriteFile(text, []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	local := "local:" + filepath.Join(dir, "*.txt")
	env := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0", "KILN_DATASETS=" + filepath.Join(dir, "presets.yaml"), "KILN_TOKENIZER=mix-4096"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"datasets", "--presets", ""}, "flag --presets is given empty: give a YAML file of dataset presets, or leave it out to use KILN_DATASETS's file"},
		// A parent's flag, given to its subcommand.
		{[]string{"datasets", "check", "--presets", "", local}, "flag --presets is given empty"},
		{[]string{"datasets", "check", "--revision", "", local}, "flag --revision is given empty: give a branch, tag or commit, or leave it out to use the preset's"},
		{[]string{"datasets", "check", "--columns=", local}, "flag --columns is given empty: give key=name pairs such as text=content, or leave it out to use the dataset's columns"},
		{[]string{"datasets", "--stores", ""}, "flag --stores is given empty: give a directory, or leave it out to use <data dir>/tokens"},
		{[]string{"tokenizers", "--tokens-dir", ""}, "flag --tokens-dir is given empty: give a directory, or leave it out to use <data dir>/tokens"},
		{[]string{"demo", "--dir", "", "--files", filepath.Join(dir, "none", "*.go"), "--engine", "bogus"}, "flag --dir is given empty: give a directory, or leave it out to use <data dir>/demo"},
		{[]string{"demo", "--files", "", "--dir", filepath.Join(dir, "demo"), "--engine", "bogus"}, "flag --files is given empty: give a glob of text files, or leave it out to use $GOROOT/src/*/*.go"},
		{[]string{"tokenize", "--tokenizer-file", "", "--in", text, "--out", filepath.Join(dir, "ids")}, "flag --tokenizer-file is given empty: give a tokenizer.json, or leave it out to use the published tokenizer --tokenizer (KILN_TOKENIZER) names"},
		{[]string{"tokenizer", "train", "--pattern", "", "--in", text, "--out", filepath.Join(dir, "tokenizer.json")}, "flag --pattern is given empty: give gpt4 or gpt2, or leave it out to use gpt4"},
		{[]string{"train", "--model", "", "--tokens", dir, "--engine", "cpu"}, "flag --model is given empty: give tiny, small or base"},
		{[]string{"train", "--precision", "", "--tokens", dir}, "flag --precision is given empty: give fp32 or bf16"},
		{[]string{"train", "--out", "", "--tokens", dir}, "flag --out is given empty: give a run directory, or leave it out to use runs/train"},
		{[]string{"train", "--run-config", "", "--tokens", dir}, "flag --run-config is given empty"},
		{[]string{"train", "--tokenizer-file", "", "--tokens", dir}, "flag --tokenizer-file is given empty"},
		{[]string{"ingest", local, "--direct", "--store", ""}, "flag --store is given empty: give a token store's name, or leave it out to use the dataset's name"},
		{[]string{"ingest", local, "--direct", "--store-dir", ""}, "flag --store-dir is given empty"},
		{[]string{"ingest", local, "--direct", "--store", "s", "--tokenizer-file", ""}, "flag --tokenizer-file is given empty"},
		{[]string{"ingest", "fineweb-edu", "--direct", "--revision", ""}, "flag --revision is given empty"},
		// Empty, a limit read as none: an unset variable in --max-tokens
		// "$LIMIT" filled the disk.
		{[]string{"ingest", local, "--direct", "--store", "s", "--max-tokens", ""}, "flag --max-tokens is given empty: give a number of tokens such as 500M, or leave it out to use no limit"},
		{[]string{"enqueue", "ingest", local, "--max-disk="}, "flag --max-disk is given empty: give a size such as 50G, or leave it out to use no limit"},
		{[]string{"enqueue", "ingest", local, "--store", ""}, "flag --store is given empty"},
		{[]string{"enqueue", "ingest", "fineweb-edu", "--presets", ""}, "flag --presets is given empty"},
		{[]string{"enqueue", "tokenizer", "t", "--presets", ""}, "flag --presets is given empty"},
		{[]string{"enqueue", "bench", "sweep", "--precision", ""}, "flag --precision is given empty: give bf16 or fp32"},
		{[]string{"enqueue", "train", "pilot-cpu", "--engine", ""}, "flag --engine is given empty: give cuda, cpu or auto, or leave it out to use the run's engine"},
		{[]string{"bench", "--model", "tiny", "--engine", "cpu", "--steps", "1", "--moe", ""}, "flag --moe is given empty: give experts=N[,top_k=K,d_ff=F,aux_coef=C], or leave it out to use the preset's dense layers"},
		{[]string{"bench", "--model", "tiny", "--engine", "cpu", "--steps", "1", "--gpus", ""}, "flag --gpus is given empty: give a number or all, or leave it out to use 1"},
	} {
		wantRefused(t, env, c.want, c.args...)
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err == nil {
		t.Errorf("tokenizer train --pattern \"\" wrote its tokenizer: it was refused after the work")
	}
}

// A path sched datasets and sched tokenizers find under the data
// directory, when their own flag (--stores, --tokens-dir) is not given, is
// refused naming what set the data directory: the flag, the variable or
// the config file. The error named --stores, which the user never gave,
// and sched tokenizers exited 1 naming nothing.
func TestTokensDirUnderTheDataDirNamesWhereTheDataDirCameFrom(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	// A file where the token stores' directory goes: the error a user who
	// may not read it gets is the same refusal (the tests run as root, who
	// may read anything).
	if err := os.WriteFile(filepath.Join(data, "tokens"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "kiln.yaml")
	if err := os.WriteFile(file, []byte("data_dir: "+data+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(data, "tokens")
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{noRedis}, []string{"--data-dir", data, "datasets"},
			"token stores' directory " + tokens + ", under --data-dir " + data + ": not a directory: make it a directory this user can read, give --data-dir another data directory, or name the token stores' directory with --stores"},
		{[]string{noRedis, "KILN_DATA_DIR=" + data}, []string{"datasets"},
			"under KILN_DATA_DIR " + data + ": not a directory: make it a directory this user can read, give KILN_DATA_DIR another data directory"},
		{[]string{noRedis, "KILN_DATA_DIR=", "KILN_CONFIG=" + file}, []string{"datasets"},
			"under the data directory " + data + " (the config file's data_dir, or the default ./.kiln): not a directory: make it a directory this user can read, give --data-dir or KILN_DATA_DIR another data directory"},
		{[]string{noRedis}, []string{"--data-dir", data, "tokenizers"},
			"token stores' directory " + tokens + ", under --data-dir " + data + ": not a directory: make it a directory this user can read, give --data-dir another data directory, or name the token stores' directory with --tokens-dir"},
		{[]string{noRedis, "KILN_DATA_DIR=" + data}, []string{"tokenizers"}, "under KILN_DATA_DIR " + data + ": not a directory"},
	} {
		wantRefused(t, c.env, c.want, c.args...)
		if _, errOut, _ := sched(t, c.env, c.args...); !strings.HasPrefix(errOut, "sched: token stores' directory ") {
			t.Errorf("sched %v: %q: the error does not start with the directory it is about", c.args, errOut)
		}
	}
	// Not made yet is no store yet, as before.
	fresh := filepath.Join(t.TempDir(), "data")
	if out, errOut, code := sched(t, []string{noRedis}, "--data-dir", fresh, "datasets"); code != 0 || !strings.Contains(out, "no token stores in "+filepath.Join(fresh, "tokens")+" yet") {
		t.Errorf("datasets with a data directory not made yet: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sched(t, []string{noRedis}, "--data-dir", fresh, "tokenizers"); code != 0 || !strings.Contains(out, "NAME") {
		t.Errorf("tokenizers with a data directory not made yet: exit %d\n%s%s", code, out, errOut)
	}
}

// A word after a switch where a command's name goes was cobra's "unknown
// command": "sched --s3-secure maybe config" said nothing of the flag. It
// now says how the switch takes a value; a real command after the switch
// still runs with it on, and an unknown command elsewhere is cobra's to
// report.
func TestSwitchBeforeAWordThatIsNoCommandSaysHowToGiveItsValue(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hi.txt"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noRedis := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--s3-secure", "maybe", "config"}, `--s3-secure maybe: the flag's value follows '=', so "maybe" here is read as a command, and 'sched' has none of that name; write --s3-secure=<value> (true or false; --s3-secure alone is true), then the command (see 'sched --help')`},
		{[]string{"--s3-secure", "maybe"}, "write --s3-secure=<value>"},
		{[]string{"--s3-secure", "confg"}, "write --s3-secure=<value> (true or false; --s3-secure alone is true), then the command, or did you mean config? (see 'sched --help')"},
		{[]string{"--log-format", "json", "--s3-secure", "maybe", "config"}, "--s3-secure maybe: "},
		{[]string{"tokenizer", "--s3-secure", "maybe", "train"}, `"maybe" here is read as a command, and 'sched tokenizer' has none of that name; write --s3-secure=<value>`},
		{[]string{"config", "--s3-secure", "maybe"}, `--s3-secure maybe: the flag's value follows '=', so "maybe" here is read as an argument of 'sched config', which expects no arguments; write --s3-secure=<value> (true or false; --s3-secure alone is true) (see 'sched config --help')`},
		{[]string{"runs", "--s3-secure", "maybe"}, `"maybe" here is read as an argument of 'sched runs', which expects no arguments`},
		{[]string{"datasets", "--s3-secure", "chek"}, "'sched datasets' has none of that name; write --s3-secure=<value> (true or false; --s3-secure alone is true), then the command, or did you mean check?"},
	} {
		wantRefused(t, noRedis, c.want, c.args...)
	}
	if out, errOut, code := sched(t, noRedis, "--s3-secure", "config"); code != 0 || !strings.Contains(out, "KILN_S3_SECURE       s3-secure        true\n") {
		t.Errorf("sched --s3-secure config: exit %d, want config with s3-secure true\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sched(t, noRedis, "datasets", "--s3-secure", "check", "local:"+filepath.Join(dir, "*.txt")); code != 0 || !strings.Contains(out, "1 file") {
		t.Errorf("sched datasets --s3-secure check: exit %d, want the check\n%s%s", code, out, errOut)
	}
	// The unknown command comes first: cobra names it, not the switch.
	wantRefused(t, noRedis, `unknown command "bogus" for 'sched'`, "bogus", "--s3-secure", "maybe")
}
