package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/kernels/cuda"
)

// sched config --check says what engine auto trains on here, checks the
// servers whatever the GPU says, and fails where the worker's settings ask
// for GPUs this machine does not give: KILN_REQUIRE_GPU with none that
// starts, KILN_GPUS above the GPUs seen. On a machine with GPUs it names
// them.
func TestConfigCheckSaysWhatEngineAutoTakes(t *testing.T) {
	t.Parallel()
	// The object store is the data directory's (no S3 endpoint): the
	// servers' part of the check is covered with S3 elsewhere.
	servers := []string{"KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0"}
	gpus := cuda.Devices()
	line := func(out, key string) string {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + ` +(.*)$`).FindStringSubmatch(out)
		if m == nil {
			return ""
		}
		return m[1]
	}

	out, errOut, code := sched(t, servers, "config", "--check")
	auto := line(out, "engine auto")
	if code != 0 || !strings.Contains(out, "redis and object store reachable") {
		t.Fatalf("config --check: exit %d\n%s%s", code, out, errOut)
	}
	if gpus == 0 {
		if !strings.HasPrefix(auto, "the CPU: ") {
			t.Errorf("no GPU here, and engine auto reads %q, want the CPU and why:\n%s", auto, out)
		}
		if line(out, "gpu 0") != "" {
			t.Errorf("no GPU here, and config --check lists one:\n%s", out)
		}
	} else {
		if auto != "the GPU" {
			t.Errorf("%d GPUs here, and engine auto reads %q:\n%s", gpus, auto, out)
		}
		for i := range gpus {
			if g := line(out, fmt.Sprintf("gpu %d", i)); !regexp.MustCompile(`: compute \d+\.\d+, \d+ SMs, [0-9.]+ GiB$`).MatchString(g) {
				t.Errorf("gpu %d reads %q:\n%s", i, g, out)
			}
		}
		if c := line(out, "cuda"); !regexp.MustCompile(`^driver CUDA \d+\.\d, NVRTC \d+\.\d+, cuBLASLt \d+\.\d+\.\d+$`).MatchString(c) {
			t.Errorf("cuda reads %q:\n%s", c, out)
		}
	}

	// The GPU worker's setting.
	out, errOut, code = sched(t, append(servers, "KILN_REQUIRE_GPU=1"), "config", "--check")
	if gpus == 0 {
		if code != 2 || !strings.Contains(errOut, "KILN_REQUIRE_GPU is set and no GPU starts here") ||
			!strings.Contains(errOut, "The GPU worker's host") {
			t.Errorf("KILN_REQUIRE_GPU without a GPU: exit %d, want 2 naming the setting and the docs\n%s%s", code, out, errOut)
		}
		if !strings.Contains(out, "redis and object store reachable") {
			t.Errorf("KILN_REQUIRE_GPU without a GPU left the servers unchecked:\n%s", out)
		}
		if a := line(out, "engine auto"); !strings.Contains(a, "archived") {
			t.Errorf("KILN_REQUIRE_GPU without a GPU: engine auto reads %q", a)
		}
	} else if code != 0 {
		t.Errorf("KILN_REQUIRE_GPU with %d GPUs: exit %d\n%s%s", gpus, code, out, errOut)
	}

	// More GPUs reserved than seen: the worker's runs would be refused.
	out, errOut, code = sched(t, append(servers, fmt.Sprintf("KILN_GPUS=%d", gpus+1)), "config", "--check")
	if gpus > 0 && (code != 2 || !strings.Contains(errOut, fmt.Sprintf("KILN_GPUS %d names more GPUs than the driver sees here (%d)", gpus+1, gpus))) {
		t.Errorf("KILN_GPUS %d with %d GPUs: exit %d, want 2 naming KILN_GPUS\n%s%s", gpus+1, gpus, code, out, errOut)
	}
	if gpus == 0 && code != 0 {
		// Without a GPU the worker trains on the CPU: the count does not matter.
		t.Errorf("KILN_GPUS 1 without a GPU: exit %d\n%s%s", code, out, errOut)
	}

	// Settings that do not read stop the check, named.
	for _, bad := range []string{"KILN_REQUIRE_GPU=maybe", "KILN_GPUS=two"} {
		out, errOut, code = sched(t, append(servers, bad), "config", "--check")
		name := bad[:strings.IndexByte(bad, '=')]
		if code != 2 || !strings.Contains(errOut, name) {
			t.Errorf("%s: exit %d, want 2 naming %s\n%s%s", bad, code, name, out, errOut)
		}
	}
}
