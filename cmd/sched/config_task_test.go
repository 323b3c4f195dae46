package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// The process a worker runs a gpu task in resolves the worker's own
// configuration, whatever config file the child's environment names or
// finds: a setting the worker resolved empty (the local directory store,
// no metrics) stays empty, and a value given by the worker's --config or
// flags is not replaced by $KILN_CONFIG's or the XDG file's.
func TestATaskProcessResolvesItsWorkersConfiguration(t *testing.T) {
	t.Parallel()
	if taskArgs[len(taskArgs)-1] != taskCommand {
		t.Fatalf("task arguments %q do not end with the task command %q", taskArgs, taskCommand)
	}
	// The worker's configuration: its --config file named another bucket
	// and tokenizer, and no object store (the local directory store).
	worker := scheduler.Config{RedisURL: "redis://:pw@worker-redis:6379/2", S3Bucket: "worker-bucket", DataDir: t.TempDir(),
		Tokenizer: "worker-tok", LogFormat: "json", ShutdownGrace: 45 * time.Second}.WithDefaults()
	if err := worker.Validate(); err != nil {
		t.Fatal(err)
	}
	masked := worker.Masked()
	want := map[string]string{}
	for _, s := range settings {
		want[s.env] = s.get(&masked)
	}

	other := []byte("s3_endpoint: elsewhere:9000\ns3_access_key: ak\ns3_secret_key: sk\ns3_bucket: other-bucket\ntokenizer: other-tok\nmetrics_addr: 127.0.0.1:9400\nshutdown_grace: 5m\n")
	dir := t.TempDir()
	named := filepath.Join(dir, "named.yaml")
	if err := os.WriteFile(named, other, 0o644); err != nil {
		t.Fatal(err)
	}
	xdg := filepath.Join(dir, "xdg")
	if err := os.MkdirAll(filepath.Join(xdg, "kiln"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(xdg, "kiln", "config.yaml"), other, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"KILN_CONFIG names a file", []string{"KILN_CONFIG=" + named}},
		{"the XDG file exists", []string{"XDG_CONFIG_HOME=" + xdg}},
	} {
		// The child's arguments, with `config` in the task command's place.
		args := append(slices.Clone(taskArgs[:len(taskArgs)-1]), "config")
		out, errOut, code := sched(t, append(c.env, configEnv(worker)...), args...)
		if code != 0 {
			t.Fatalf("%s: sched %q: exit %d: %s", c.name, args, code, errOut)
		}
		got := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				got[f[0]] = strings.Join(f[2:], " ")
			}
		}
		for env, v := range want {
			if got[env] != v {
				t.Errorf("%s: the task process resolves %s %q; its worker's is %q", c.name, env, got[env], v)
			}
		}
	}
}
