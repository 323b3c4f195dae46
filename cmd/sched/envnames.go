package main

// The KILN_* variables kiln reads, and the warning every command gives of
// one in its environment that it does not read: a mistyped name
// (KILN_REDIS_ULR) is otherwise ignored without a word, and the setting
// it was meant for keeps its default.

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/internal/nearest"
	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/kernels/cuda"
)

// kilnPrefix begins the name of every variable of kiln's own.
const kilnPrefix = "KILN_"

// composeVariables are the KILN_* variables of compose's .env that compose
// itself reads (docs/operations.md): the address it publishes the ports
// on, Redis's maxmemory, and the runs file it passes to the GPU worker as
// its KILN_RUNS. A shell that sources .env hands them to sched too, which
// has nothing to do with them and nothing to warn of.
var composeVariables = []string{"KILN_BIND", "KILN_REDIS_MAXMEMORY", "KILN_WORKER_RUNS"}

// harnessVariables are KILN_* variables set around sched by something
// other than its user, which sched rightly does not read: none in sched
// itself; the tests that run their binary as sched name theirs.
var harnessVariables []string

// kilnVariables is every KILN_* variable that kiln reads, gathered from
// where each is read rather than listed again here: the settings that have
// a flag (settings), those read from the environment alone (envOnly), the
// GPU engine's (whatever kernels.ParseOptions asks for), the NCCL library,
// the config file's, and Software Heritage's endpoint, which ingest reads
// as it is.
func kilnVariables() map[string]bool {
	known := map[string]bool{"KILN_CONFIG": true, "KILN_SWH_ENDPOINT": true, cuda.NCCLLibraryEnv: true}
	for _, s := range settings {
		known[s.env] = true
	}
	for _, e := range envOnly {
		known[e.env] = true
	}
	// Every variable unset: nothing to refuse, so each is asked for.
	kernels.ParseOptions(func(name string) string {
		known[name] = true
		return ""
	})
	for name := range known {
		if !strings.HasPrefix(name, kilnPrefix) {
			delete(known, name) // HF_TOKEN, HF_ENDPOINT: not kiln's names
		}
	}
	return known
}

// warnsOfVariables says whether the command args name warns of variables
// kiln does not read: every one but a gpu task's process, whose worker
// warned of its environment, which the process shares, as it started;
// and cobra's completion request, whose stderr the shell's completion
// script drops.
func warnsOfVariables(args []string) bool {
	c, _, err := rootCmd.Find(args)
	if err != nil {
		return true
	}
	switch c.Name() {
	case taskCommand, cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
		return false
	}
	return true
}

// warnUnknownVariables writes a warning to w for each variable of environ
// (os.Environ's "NAME=value" form) whose name begins KILN_, in any case,
// and that kiln does not read, naming the one it most likely meant where
// one is close: "warning: KILN_REDIS_ULR is not a variable kiln reads:
// did you mean KILN_REDIS_URL?". The command goes on: the variable changes
// nothing. compose's and the harness's variables are no mistake, and no
// name meant either.
func warnUnknownVariables(w io.Writer, environ []string) {
	var known []string
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(strings.ToUpper(name), kilnPrefix) {
			continue
		}
		if known == nil {
			known = sortedKeys(kilnVariables())
		}
		quiet := slices.Contains(composeVariables, name) || slices.Contains(harnessVariables, name)
		if !quiet && !slices.Contains(known, name) && !slices.Contains(unknown, name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		msg := fmt.Sprintf("warning: %s is not a variable kiln reads", name)
		if near := nearestName(name, known); near != "" {
			msg += ": did you mean " + near + "?"
		} else {
			msg += " (README.md's Configuration lists those it does, docs/operations.md's \"GPU engine settings\" the KILN_CUDA_* ones); it is ignored"
		}
		fmt.Fprintln(w, msg)
	}
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// nearestName is the name of known closest to name, compared in upper
// case (a variable's name is read as typed, so kiln_redis_url is not
// KILN_REDIS_URL), where it is close enough to be the one meant: as many
// edits (a swap of two letters is one) as a third of the letters after
// KILN_ of the longer of the two, or 2; or the first that name begins
// with its part up to an underscore. "" where none is.
func nearestName(name string, known []string) string {
	up := strings.ToUpper(name)
	for _, k := range known {
		if strings.HasPrefix(k, up+"_") {
			return k // its end left out: KILN_S3_SECRET
		}
	}
	best, bestD := "", -1
	for _, k := range known {
		d := nearest.Distance(up, k)
		if d > max(2, (max(len(up), len(k))-len(kilnPrefix))/3) {
			continue
		}
		if bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	return best
}
