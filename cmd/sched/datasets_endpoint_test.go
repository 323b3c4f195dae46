package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// sched datasets check of a hub dataset, with an HF_ENDPOINT that nothing
// listens at, exits 2 at once with one line naming HF_ENDPOINT, as an
// unreachable Redis does: no minute of retries that meet the same
// refusal.
func TestDatasetsCheckOfAHubNotReachedNamesHFEndpoint(t *testing.T) {
	t.Parallel()
	addr := refusingHubAddr(t)
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("code:\n  repo: org/code\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	out, errOut, code := sched(t, []string{"HF_ENDPOINT=http://" + addr}, "datasets", "check", "code", "--presets", presets)
	want := "connection refused: the Hub at HF_ENDPOINT http://" + addr + " is not reached from here; check this machine's network and proxy, or set HF_ENDPOINT to the Hub's address or a mirror's"
	if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, want) || strings.Contains(errOut, "trying again") {
		t.Errorf("check with HF_ENDPOINT at a closed port: exit %d\n%s%s\nwant exit 2 and one line containing %q", code, out, errOut, want)
	}
}

// sched datasets check with an HF_ENDPOINT that has a path too many
// (.../api), answered 404 without the Hub's error code, names HF_ENDPOINT
// and exits 2, where it said the dataset was not found.
func TestDatasetsCheckAtAnEndpointThatIsNotTheHubNamesHFEndpoint(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Add("org/code", "data/a.jsonl", []byte(`{"text":"x = 1"}`+"\n"), false)
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("code:\n  repo: org/code\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	if out, errOut, code := sched(t, []string{"HF_ENDPOINT=" + hub.Server.URL}, "datasets", "check", "code", "--presets", presets); code != 0 {
		t.Fatalf("check at the Hub's address: exit %d\n%s%s", code, out, errOut)
	}
	env := []string{"HF_ENDPOINT=" + hub.Server.URL + "/api"}
	wantRefused(t, env, "HF_ENDPOINT "+hub.Server.URL+"/api may not be the Hub's address or a mirror's",
		"datasets", "check", "code", "--presets", presets)
	if _, errOut, _ := sched(t, env, "datasets", "check", "code", "--presets", presets); strings.Contains(errOut, "not found in dataset") {
		t.Errorf("check at HF_ENDPOINT .../api blames the dataset: %s", errOut)
	}
}

// refusingHubAddr is a loopback address that refuses every connection: a
// socket bound to it that does not listen holds the port, so that no other
// process can take it while the test runs.
func refusingHubAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
