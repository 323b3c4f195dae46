package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/internal/yamlstrict"
	"github.com/kiln-lm/kiln/scheduler"
)

// readmeTable is the table that follows heading in README.md: its rows,
// each its cells trimmed, the header and the rule left out.
func readmeTable(t *testing.T, heading string) [][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	var rows [][]string
	for _, l := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(l, "|") {
			if len(rows) > 0 {
				break
			}
			continue
		}
		// "\|" is a pipe inside a cell.
		cells := strings.Split(strings.ReplaceAll(strings.Trim(l, "|"), `\|`, "\x00"), "|")
		for i, c := range cells {
			cells[i] = strings.ReplaceAll(strings.TrimSpace(c), "\x00", "|")
		}
		rows = append(rows, cells)
	}
	if len(rows) < 3 {
		t.Fatalf("README.md's %q has no table", heading)
	}
	return rows[2:]
}

var backticked = regexp.MustCompile("`([^`]*)`")

// code is the text of the first code span of cell, or "".
func code(cell string) string {
	if m := backticked.FindStringSubmatch(cell); m != nil {
		return m[1]
	}
	return ""
}

// Each row of the README's configuration table holds as the code reads it:
// the variable sets the setting whose flag and config file key the row
// names (the file's key setting what the variable does), its default is
// the one the configuration resolves to, and a setting read from the
// environment alone has neither flag nor key. Every setting has its row.
func TestREADMEConfigurationTableIsTheCodes(t *testing.T) {
	t.Parallel()
	defaults := scheduler.Config{}.WithDefaults()
	rows := map[string]bool{}
	for _, r := range readmeTable(t, "## Configuration") {
		if len(r) != 5 {
			t.Fatalf("configuration row %q: want 5 cells", r)
		}
		env, flag, key, def := code(r[0]), r[1], r[2], r[3]
		rows[env] = true
		s, ok := settingOf(env)
		if !ok {
			var unset string
			for _, e := range envOnly {
				if e.env == env {
					unset = e.unset
				}
			}
			if unset == "" {
				t.Errorf("README.md's %s is neither a setting nor read from the environment alone", env)
				continue
			}
			if key != "" {
				t.Errorf("README.md gives %s, read from the environment alone, the config file key %s", env, key)
			}
			// A command's own flag naming the same thing (--presets of the
			// commands that read KILN_DATASETS).
			if f := code(flag); f != "" {
				commands := backticked.FindAllStringSubmatch(strings.SplitN(flag, " of ", 2)[1], -1)
				for _, c := range commands {
					cmd, rest, err := rootCmd.Find(strings.Fields(c[1]))
					if err != nil || len(rest) > 0 || cmd.Flag(strings.TrimPrefix(f, "--")) == nil {
						t.Errorf("README.md names %s of 'sched %s' for %s: no such flag there", f, c[1], env)
					}
				}
			}
			if d := code(def); d != "" && !strings.HasSuffix(unset, ": "+d) {
				t.Errorf("README.md's default of %s is %q; sched config says %q", env, d, unset)
			}
			continue
		}
		if want := "`--" + s.flag + "`"; flag != want {
			t.Errorf("README.md's flag of %s is %s; the code's is %s", env, flag, want)
		}
		// loadConfig names a file's key by its flag's name.
		if want := "`" + strings.ReplaceAll(s.flag, "-", "_") + "`"; key != want {
			t.Errorf("README.md's config file key of %s is %s; want %s", env, key, want)
		}
		var value string
		var byEnv scheduler.Config
		for _, v := range []string{"probe-value", "true", "45s"} {
			if s.set(&byEnv, v) == nil {
				value = v
				break
			}
		}
		var byFile scheduler.Config
		if err := yamlstrict.Unmarshal([]byte(code(key)+": "+value+"\n"), &byFile); err != nil {
			t.Errorf("config file key %s: %v", key, err)
		} else if got := s.get(&byFile); got != s.get(&byEnv) || got == s.get(&scheduler.Config{}) {
			t.Errorf("config file %s: %s sets %s to %q; %s=%s sets it to %q", key, value, env, got, env, value, s.get(&byEnv))
		}
		got, want := s.get(&defaults), code(def)
		switch {
		case want == "KILN_DATA_DIR":
			want = defaults.DataDir
		case strings.HasPrefix(def, "empty") || def == "":
			want = ""
		case want == "":
			t.Errorf("README.md's default of %s, %q, is no value", env, def)
		}
		if got != want && filepath.Clean(want) != got {
			t.Errorf("README.md's default of %s is %q; the configuration's is %q", env, def, got)
		}
	}
	for _, s := range settings {
		if !rows[s.env] {
			t.Errorf("README.md's configuration table has no row for %s (--%s)", s.env, s.flag)
		}
	}
}

// settingOf is the setting of variable env.
func settingOf(env string) (setting, bool) {
	for _, s := range settings {
		if s.env == env {
			return s, true
		}
	}
	return setting{}, false
}

// Each command of the README's "Commands" table is sched's, with the flags
// it is written with, and every command prints its help with --help.
func TestREADMECommandsAreSchedsAndEachHasHelp(t *testing.T) {
	t.Parallel()
	named := 0
	for _, r := range readmeTable(t, "## Commands") {
		for _, m := range backticked.FindAllStringSubmatch(r[0], -1) {
			words, ok := strings.CutPrefix(m[1], "sched ")
			if !ok {
				continue
			}
			var path []string
			for _, w := range strings.Fields(words) {
				if strings.ContainsAny(w[:1], "<[-") {
					break
				}
				path = append(path, w)
			}
			cmd, rest, err := rootCmd.Find(path)
			if err != nil || cmd == rootCmd || len(rest) > 0 && !strings.Contains(cmd.Use, "<") {
				t.Errorf("README.md's %q: no such command (%v, arguments %q)", m[1], err, rest)
				continue
			}
			named++
			// An optional subcommand: datasets [check <name>].
			for _, w := range strings.Fields(words) {
				if sub, ok := strings.CutPrefix(w, "["); ok && sub != "" && sub[0] >= 'a' && sub[0] <= 'z' {
					if c, _, err := cmd.Find([]string{sub}); err != nil || c.Name() != sub {
						t.Errorf("README.md's %q: '%s' has no command %s", m[1], cmd.CommandPath(), sub)
					}
				}
			}
			for _, w := range strings.Fields(strings.NewReplacer("[", " ", "]", " ", "|", " ").Replace(words)) {
				name, ok := strings.CutPrefix(w, "--")
				name, _, _ = strings.Cut(name, "=")
				if ok && cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
					t.Errorf("README.md's %q: '%s' has no flag --%s", m[1], cmd.CommandPath(), name)
				}
			}
		}
	}
	if named < 15 {
		t.Fatalf("README.md's Commands table names %d commands; it names more", named)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.IsAvailableCommand() || c == rootCmd {
			args := append(strings.Fields(c.CommandPath())[1:], "--help")
			out, errOut, code := sched(t, nil, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "Usage:\n  "+c.CommandPath()) {
				t.Errorf("sched %s: exit %d, stderr %q; want its help\n%s", strings.Join(args, " "), code, errOut, out)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(rootCmd)
}
