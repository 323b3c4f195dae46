package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every example a command's help shows is a command sched takes: the
// command path is the one whose help shows it, each flag exists and reads
// its value, and the positional arguments are what the command accepts.
// An example that a user copies and sched refuses is worse than none.
func TestExamplesAreCommandsSchedTakes(t *testing.T) {
	seen := 0
	walk(rootCmd, func(c *cobra.Command) {
		for _, line := range strings.Split(c.Example, "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			seen++
			words, err := exampleWords(line)
			if err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
				continue
			}
			found, rest, err := rootCmd.Find(words[1:])
			if err != nil || found != c {
				t.Errorf("%s: example %q runs %v (%v), not this command", c.CommandPath(), line, commandPath(found), err)
				continue
			}
			fs := checkedFlags(found)
			if err := fs.Parse(rest); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), line, err)
				continue
			}
			if found.Args != nil {
				if err := found.Args(found, fs.Args()); err != nil {
					t.Errorf("%s: example %q: arguments %q refused: %v", c.CommandPath(), line, fs.Args(), err)
				}
			}
		}
	})
	if seen == 0 {
		t.Fatal("no command shows an example")
	}
}

func walk(c *cobra.Command, f func(*cobra.Command)) {
	f(c)
	for _, sub := range c.Commands() {
		walk(sub, f)
	}
}

func commandPath(c *cobra.Command) string {
	if c == nil {
		return "nothing"
	}
	return c.CommandPath()
}

// exampleWords splits an example line as a shell would, for the simple
// quoting examples use, and returns the words of its sched command: from
// "sched" to the end or to the next command (|, && or ;), past any
// VAR=value before it.
func exampleWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	quote := rune(0)
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	start := -1
	for i, w := range words {
		if w == "sched" {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, fmt.Errorf("no sched command in it")
	}
	words = words[start:]
	for i, w := range words {
		if w == "|" || w == "&&" || w == ";" {
			words = words[:i]
			break
		}
	}
	return words, nil
}

// checkedFlags is a fresh flag set with c's flags, local and inherited,
// whose values check what they are given by the flag's type and keep
// nothing: parsing an example leaves the commands' own flags as they were.
func checkedFlags(c *cobra.Command) *pflag.FlagSet {
	fs := pflag.NewFlagSet(c.Name(), pflag.ContinueOnError)
	add := func(f *pflag.Flag) {
		if fs.Lookup(f.Name) != nil {
			return
		}
		nf := *f
		nf.Value = &typeCheck{typ: f.Value.Type()}
		fs.AddFlag(&nf)
	}
	c.Flags().VisitAll(add)
	c.InheritedFlags().VisitAll(add)
	return fs
}

type typeCheck struct{ typ string }

func (v *typeCheck) String() string { return "" }
func (v *typeCheck) Type() string   { return v.typ }
func (v *typeCheck) Set(s string) error {
	var err error
	switch v.typ {
	case "int", "int64":
		_, err = strconv.ParseInt(s, 10, 64)
	case "uint", "uint64":
		_, err = strconv.ParseUint(s, 10, 64)
	case "float64":
		_, err = strconv.ParseFloat(s, 64)
	case "bool":
		_, err = strconv.ParseBool(s)
	case "duration":
		_, err = time.ParseDuration(s)
	}
	return err
}

// Every command a user runs shows examples in its help: all but the help
// and completion commands cobra adds, the hidden task runner, version,
// which takes nothing, and the groups whose subcommands show theirs.
func TestEveryCommandShowsExamples(t *testing.T) {
	walk(rootCmd, func(c *cobra.Command) {
		for p := c; p != nil; p = p.Parent() {
			if p.Name() == "help" || p.Name() == "completion" {
				return
			}
		}
		if !c.Runnable() || c.Hidden || c == rootCmd || c.Name() == "version" || (c.HasSubCommands() && c.Example == "") {
			return
		}
		if strings.TrimSpace(c.Example) == "" {
			t.Errorf("%s --help shows no example", c.CommandPath())
		}
	})
}
