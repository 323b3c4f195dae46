package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// TestMain lets the test binary act as sched itself: with KILN_SCHED_EXEC
// set it runs main with its arguments, so tests run the real CLI (exit
// codes, signals) in real processes, with test handlers registered.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_SCHED_EXEC") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// sched runs the CLI in a child process with only the given environment
// (plus PATH and HOME pointing at a temp dir, so no user config is read).
func sched(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(baseEnv(t), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// wantRefused runs the CLI as sched does and fails t unless it exits 2
// with one line on stderr that contains want: the form every refusal of
// bad input takes.
func wantRefused(t *testing.T, env []string, want string, args ...string) {
	t.Helper()
	out, errOut, code := sched(t, env, args...)
	if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, want) {
		t.Errorf("%v sched %v: exit %d\n%s%s\nwant exit 2 and one line containing %q", env, args, code, out, errOut, want)
	}
}

func baseEnv(t *testing.T) []string {
	home := t.TempDir()
	return []string{"KILN_SCHED_EXEC=1", "PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"), "KILN_DATA_DIR=" + filepath.Join(home, "data")}
}

func TestConfigPrecedenceAndMasking(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "kiln.yaml")
	os.WriteFile(file, []byte("redis_url: redis://file:1/0\ns3_bucket: from-file\ns3_endpoint: minio:9000\ns3_access_key: ak\ns3_secret_key: file-secret\nshutdown_grace: 2m\n"), 0o644)
	out, errOut, code := sched(t, []string{"KILN_S3_BUCKET=from-env", "KILN_REDIS_URL=redis://env:2/0", "HF_TOKEN=hf_secret"},
		"config", "--config", file, "--redis-url", "redis://:pw@flag:3/1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"redis://:xxxxx@flag:3/1", "from-env", "minio:9000", "2m0s", "****"} {
		if !strings.Contains(out, want) {
			t.Errorf("config output lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{"file-secret", "hf_secret", ":pw@"} {
		if strings.Contains(out, secret) {
			t.Errorf("config output shows secret %q:\n%s", secret, out)
		}
	}
}

// A setting the configuration refuses is named where the user gave it: the
// config file's key, the environment variable, or the flag, whichever won;
// a value nobody gave is named by its variable and flag.
func TestConfigErrorsNameWhereTheValueCameFrom(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "kiln.yaml")
	os.WriteFile(file, []byte("log_format: xml\n"), 0o644)
	s3 := filepath.Join(dir, "s3.yaml")
	os.WriteFile(s3, []byte("s3_endpoint: minio:9000\n"), 0o644)
	s3NoSecret := filepath.Join(dir, "s3-no-secret.yaml")
	os.WriteFile(s3NoSecret, []byte("s3_endpoint: minio:9000\ns3_access_key: ak\n"), 0o644)
	for _, c := range []struct {
		env  []string
		args string
		want string
	}{
		{nil, "--config " + file, "config file " + file + `: log_format: "xml" is not one of json, console, auto`},
		{[]string{"KILN_LOG_FORMAT=yaml"}, "--config " + file, `KILN_LOG_FORMAT: "yaml" is not one of`},
		{[]string{"KILN_LOG_FORMAT=yaml"}, "--config " + file + " --log-format toml", `--log-format: "toml" is not one of`},
		{[]string{"KILN_TOKENIZER=-x"}, "", `KILN_TOKENIZER: tokenizer name "-x": use letters, digits`},
		{nil, "--config " + s3, "KILN_S3_ACCESS_KEY (--s3-access-key): an S3 endpoint is set but its access key is empty"},
		// The key that is empty is the one named.
		{nil, "--config " + s3NoSecret, "KILN_S3_SECRET_KEY (--s3-secret-key): an S3 endpoint is set but its secret key is empty"},
		{[]string{"KILN_S3_SECRET_KEY=sk"}, "--config " + s3NoSecret + " --s3-secret-key=", "--s3-secret-key"},
	} {
		_, errOut, code := sched(t, c.env, append([]string{"config"}, strings.Fields(c.args)...)...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v sched config %s: exit %d, %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
	}
}

// TestBadInputExitsTwo checks that each usage mistake is one line on stderr
// that names the input, with exit code 2.
func TestBadInputExitsTwo(t *testing.T) {
	t.Parallel()
	redis := testsvc.Redis(t)
	s3 := testsvc.S3(t)
	good := "KILN_REDIS_URL=redis://" + redis + "/0"
	dir := t.TempDir()
	badYAML := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badYAML, []byte("# kiln\nredis_ur1: x\n"), 0o644)
	twoDocs := filepath.Join(dir, "two.yaml")
	os.WriteFile(twoDocs, []byte("s3_bucket: first\n---\nredis_ur1: x\n"), 0o644)
	runYAML := filepath.Join(dir, "run.yaml")
	os.WriteFile(runYAML, []byte("model: tiny\nchekpoint_every: 5\n"), 0o644)
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown work", []string{good}, []string{"enqueue", "dataset"}, `unknown work "dataset"`},
		{"no work", []string{good}, []string{"enqueue"}, "say what to enqueue"},
		{"bad run name", []string{good}, []string{"enqueue", "train", "a/b"}, `run name "a/b"`},
		{"missing dataset", []string{good}, []string{"enqueue", "ingest"}, "expects one dataset: a preset ('sched datasets' lists them) or local:<glob> (got none)"},
		// A word after a switch is an argument: it is named.
		{"a word after a switch", []string{good}, []string{"config", "--s3-secure", "maybe"}, `--s3-secure maybe: the flag's value follows '=', so "maybe" here is read as an argument of 'sched config', which expects no arguments; write --s3-secure=<value>`},
		{"unknown sweep", []string{good}, []string{"enqueue", "bench", "nosuchsweep", "--sweep"}, `--sweep "nosuchsweep": the one sweep is "sweep"`},
		{"unknown dataset", []string{good}, []string{"enqueue", "ingest", "the-stack-v3"}, `unknown dataset "the-stack-v3"`},
		{"local dataset without a store", []string{good}, []string{"enqueue", "ingest", "local:/src/*.go"}, "needs --store NAME"},
		{"bad token limit", []string{good}, []string{"enqueue", "ingest", "the-stack-v2", "--max-tokens", "lots"}, `--max-tokens "lots"`},
		{"a token limit of 0", []string{good}, []string{"enqueue", "ingest", "the-stack-v2", "--max-tokens", "0"}, `--max-tokens 0: give a positive limit, or leave it out for none`},
		{"a negative token limit", []string{good}, []string{"enqueue", "ingest", "the-stack-v2", "--max-tokens", "-5M"}, `--max-tokens "-5M": negative: give a positive limit, or leave it out for none`},
		{"a disk limit of 0", []string{good}, []string{"enqueue", "ingest", "the-stack-v2", "--max-disk", "0GB"}, `--max-disk 0GB: give a positive limit`},
		{"a run's data is its YAML's", []string{good}, []string{"enqueue", "train", "r", "--store", "a"}, "unknown flag: --store"},
		{"malformed redis url", nil, []string{"status", "--redis-url", "localhost:6379"}, `--redis-url: "localhost:6379" is not a redis://`},
		{"malformed redis url in the environment", []string{"KILN_REDIS_URL=localhost:6379"}, []string{"status"}, `KILN_REDIS_URL: "localhost:6379" is not a redis://`},
		{"unreachable redis", []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}, []string{"status"}, "cannot reach Redis at redis://127.0.0.1:1/0"},
		{"bad queues", []string{good}, []string{"worker", "--queues", "cpu=2"}, `unknown queue "cpu"`},
		{"two gpu tasks at once", []string{good}, []string{"worker", "--queues", "gpu=2"}, `gpu=2: the gpu queue runs one task at a time`},
		{"unknown task id", []string{good}, []string{"cancel", "nope"}, `task "nope" not found`},
		{"bad grace", []string{good, "KILN_SHUTDOWN_GRACE=soon"}, []string{"config"}, "KILN_SHUTDOWN_GRACE"},
		{"bad config key", []string{good}, []string{"config", "--config", badYAML}, `config file ` + badYAML + `: line 2: unknown key "redis_ur1" (did you mean redis_url?); the keys here are data_dir, hf_token,`},
		{"a second document in the config file", []string{good}, []string{"config", "--config", twoDocs}, `config file ` + twoDocs + `: line 3: a second YAML document begins at the "---" of line 2`},
		{"bad run config key", nil, []string{"train", "--run-config", runYAML}, `run config ` + runYAML + `: line 2: unknown key "chekpoint_every" (did you mean checkpoint_every?)`},
		{"missing config file", []string{good}, []string{"config", "--config", filepath.Join(dir, "none.yaml")}, "none.yaml"},
		{"wrong s3 credentials", []string{good, "KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey, "KILN_S3_SECRET_KEY=wrong"},
			[]string{"config", "--check"}, "KILN_S3_SECRET_KEY"},
		{"unreachable s3", []string{good, "KILN_S3_ENDPOINT=127.0.0.1:1", "KILN_S3_ACCESS_KEY=ak", "KILN_S3_SECRET_KEY=sk"},
			[]string{"results", "pilot"}, "cannot reach the object store at http://127.0.0.1:1 (KILN_S3_ENDPOINT"},
		{"https to an http s3", []string{good, "KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey, "KILN_S3_SECRET_KEY=" + s3.SecretKey, "KILN_S3_SECURE=true"},
			[]string{"results", "pilot"}, "cannot reach the object store at https://" + s3.Endpoint},
		{"unknown flag", []string{good}, []string{"status", "--colour"}, "unknown flag: --colour"},
		{"unknown command", []string{good}, []string{"nope"}, `unknown command "nope" for 'sched' (see 'sched --help')`},
		{"misspelt command", []string{good}, []string{"statu"}, `unknown command "statu" for 'sched': did you mean status? (see 'sched --help')`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, errOut, code := sched(t, c.env, c.args...)
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if code != exitBadInput || len(lines) != 1 || !strings.Contains(errOut, c.want) {
				t.Fatalf("sched %v: exit %d, stderr %q; want exit 2 and one line containing %q", c.args, code, errOut, c.want)
			}
			if strings.Contains(errOut, "wrong") && c.name == "wrong s3 credentials" && strings.Contains(errOut, "=wrong") {
				t.Fatalf("error shows the secret: %s", errOut)
			}
		})
	}
}

// local_roots in a config file takes a YAML list or one string of
// directories separated as in PATH, as KILN_LOCAL_ROOTS does; anything else
// is refused naming the file.
func TestConfigFileLocalRoots(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct{ yaml, want string }{
		{"local_roots: /corpus:/more\n", "/corpus:/more"},
		{"local_roots: [/corpus, /more]\n", "/corpus:/more"},
		{"local_roots:\n  - /corpus\n", "/corpus"},
	} {
		file := filepath.Join(dir, "kiln.yaml")
		os.WriteFile(file, []byte(c.yaml), 0o644)
		out, errOut, code := sched(t, nil, "config", "--config", file)
		if got := lineOf(out, "KILN_LOCAL_ROOTS"); code != 0 || !strings.HasSuffix(got, " "+c.want) {
			t.Errorf("%q: exit %d, line %q, want %s\n%s", c.yaml, code, got, c.want, errOut)
		}
	}
	file := filepath.Join(dir, "bad.yaml")
	os.WriteFile(file, []byte("local_roots: {a: b}\n"), 0o644)
	if _, errOut, code := sched(t, nil, "config", "--config", file); code != 2 || !strings.Contains(errOut, file) || !strings.Contains(errOut, "list of directories") {
		t.Errorf("a mapping for local_roots: exit %d, %q", code, errOut)
	}
}

// --s3-secure is a switch: alone it means true, =false turns off what the
// environment turned on, and a value it cannot read is refused naming it.
func TestS3SecureIsASwitch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "false"},
		{nil, []string{"--s3-secure"}, "true"},
		{[]string{"KILN_S3_SECURE=true"}, nil, "true"},
		{[]string{"KILN_S3_SECURE=true"}, []string{"--s3-secure=false"}, "false"},
	} {
		out, errOut, code := sched(t, c.env, append([]string{"config"}, c.args...)...)
		if got := lineOf(out, "KILN_S3_SECURE"); code != 0 || !strings.HasSuffix(got, " "+c.want) {
			t.Errorf("env %v, flags %v: exit %d, line %q, want %s\n%s", c.env, c.args, code, got, c.want, errOut)
		}
	}
	if _, errOut, code := sched(t, nil, "config", "--s3-secure=yes please"); code != 2 || !strings.Contains(errOut, "s3-secure") {
		t.Errorf("--s3-secure='yes please': exit %d, %q", code, errOut)
	}
}

// The README names the settings `sched config` prints from the
// environment alone, each of them and no other.
func TestREADMENamesTheEnvironmentOnlySettings(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`read from the environment alone\s*\(([^)]*)\)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md no longer says which settings `sched config` reads from the environment alone")
	}
	var said, want []string
	for _, n := range regexp.MustCompile("`([A-Z_]+)`").FindAllSubmatch(m[1], -1) {
		said = append(said, string(n[1]))
	}
	for _, e := range envOnly {
		want = append(want, e.env)
	}
	if !slices.Equal(said, want) {
		t.Errorf("README.md names %v as read from the environment alone; sched config prints %v", said, want)
	}
}
