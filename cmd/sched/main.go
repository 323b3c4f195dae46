// Command sched is kiln's one binary: it enqueues work, runs workers, trains,
// tokenizes, verifies and benchmarks. Each subcommand lives in its own file
// and adds itself to the root command from an init function.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/internal/durlimit"
	"github.com/kiln-lm/kiln/internal/redismem"
)

// Exit codes. Bad input (a usage mistake, an unknown name, a malformed file,
// a server that refuses our credentials) exits 2 so that scripts can tell it
// from a failure of the work itself (1).
const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2
	// exitInterrupted is a command stopped by Ctrl-C or SIGTERM that says
	// what it kept (the shell's 128 + SIGINT).
	exitInterrupted = 130
)

var rootCmd = &cobra.Command{
	Use:   "sched",
	Short: "kiln: turn public datasets into a small code language model on one GPU",
	Long: `sched drives kiln: enqueue ingest and training work, run workers, and
inspect runs. Configuration comes from flags, then KILN_* environment
variables, then an optional config file (see 'sched config').`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	// cobra adds these two when it runs; added now, they are checked too.
	rootCmd.InitDefaultHelpCmd()
	rootCmd.InitDefaultCompletionCmd()
	strictArgs(rootCmd)
	if warnsOfVariables(os.Args[1:]) {
		// First, so that a failure it explains (Redis not reached at the
		// default address, KILN_REDIS_URL mistyped) comes after it.
		warnUnknownVariables(os.Stderr, os.Environ())
	}
	if err := checkSwitchWords(os.Args[1:]); err != nil {
		os.Exit(report(err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if secondSignalEnds(os.Args[1:]) {
		// The first signal asks the command to stop where it keeps its
		// work whole; a second one ends the process at once, as if it were
		// not caught, for a stop the command is slow to make (a CPU step
		// of minutes, a long sample) or one the user will not wait for.
		context.AfterFunc(ctx, stop)
	}
	cmd, err := rootCmd.ExecuteContextC(ctx)
	stop()
	os.Exit(report(stoppedBySignal(ctx, cmd, err)))
}

// secondSignalEnds says whether a second signal ends the command args
// names at once: every command but a gpu task's process, which its worker
// stops (one SIGTERM, then SIGKILL after the grace) and which may get the
// same SIGTERM from elsewhere too (systemd's stop signals every process
// of the worker's unit), so that a second one must not cost the
// checkpoint the first is writing.
func secondSignalEnds(args []string) bool {
	c, _, err := rootCmd.Find(args)
	return err != nil || c.Name() != taskCommand
}

// stoppedBySignal is the error of a command that a signal stopped where
// the command itself says no more than that its context ended: it says
// which command stopped, and why, and exits 130 as the commands that say
// what they kept do.
func stoppedBySignal(ctx context.Context, cmd *cobra.Command, err error) error {
	if err == nil || ctx.Err() == nil || cmd == nil || isBadInput(err) || errors.As(err, new(interruptedError)) {
		return err
	}
	cause := context.Cause(ctx)
	if !errors.Is(err, context.Canceled) && !errors.Is(err, cause) {
		return err
	}
	name := strings.TrimPrefix(cmd.CommandPath(), rootCmd.Name()+" ")
	return interruptedError{fmt.Errorf("%s stopped (%w) before it finished", name, cause)}
}

// report prints err on one line and maps it to an exit code.
func report(err error) int { return reportTo(os.Stderr, err) }

// reportTo is report writing to w.
func reportTo(w io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	if !isBadInput(err) && errors.Is(err, fs.ErrPermission) {
		// A path this user may not use: the user's to fix, and the
		// system's error names the path but not what to do.
		err = badInputError{fmt.Errorf("%w (this user may not use that path: run as the user that owns it, or give this one access; where it is the data directory, KILN_DATA_DIR or --data-dir names another)", err)}
	}
	if redismem.Refused(err) && !errors.As(err, new(*redismem.FullError)) {
		// A write that Redis refused for memory where no command said
		// so: what it means, and what to do.
		err = fmt.Errorf("%w (Redis refused a write because it is full: its used memory is over its maxmemory; %s)", err, redismem.Remedy)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		// One line, so that logs and scripts see the whole error; cobra's
		// "Did you mean" suggestions come on lines of their own.
		msg = strings.Join(strings.Fields(msg), " ")
	}
	// cobra's own, at the root, in the words of the commands below it
	// (didYouMean); strictArgs's already name a command's help.
	if m := rootUnknown.FindStringSubmatch(msg); !isBadInput(err) && m != nil {
		msg = fmt.Sprintf("unknown command %q for '%s' (see '%s --help')", m[1], rootCmd.Name(), rootCmd.Name())
		if e := didYouMean(rootCmd, m[1]); e != nil {
			msg = e.Error()
		}
	}
	fmt.Fprintln(w, "sched:", escapeControls(msg))
	return exitCode(err)
}

// escapeControls writes the control characters of s as Go escapes
// (\x1b, \a): an error may name a file whose name a dataset's owner chose,
// and its escape sequences, printed raw, set the terminal's title, its
// colours, or cleared the screen.
func escapeControls(s string) string {
	if !strings.ContainsFunc(s, isControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !isControl(r) {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r) // '\x1b', '\a', '\u0085'
		b.WriteString(q[1 : len(q)-1])
	}
	return b.String()
}

// isControl is a C0 or C1 control character or DEL, a tab aside.
func isControl(r rune) bool { return r != '\t' && unicode.IsControl(r) }

// rootUnknown is cobra's error for an unknown command at the root, with
// its "Did you mean this?" lines, if any, joined onto its own.
var rootUnknown = regexp.MustCompile(`^unknown command "(.*)" for "[^"]*"`)

// exitCode maps a command's error to the process's exit code.
func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	// cobra reports an unknown subcommand as a plain error.
	case isBadInput(err) || strings.HasPrefix(err.Error(), "unknown command "):
		return exitBadInput
	// Redis full, as Redis not reached or refusing the URL's credentials:
	// the operator's to fix, not the work's failure. Not bad input below
	// cmd: a worker's task that meets a full Redis is retried.
	case redismem.Refused(err):
		return exitBadInput
	case errors.As(err, new(interruptedError)):
		return exitInterrupted
	}
	return exitFailure
}

// interruptedError marks the error of a command stopped by a signal, whose
// message says what was kept (exit code 130).
type interruptedError struct{ err error }

func (e interruptedError) Error() string { return e.err.Error() }
func (e interruptedError) Unwrap() error { return e.err }

// badInputError marks an error as the caller's to fix (exit code 2).
type badInputError struct{ err error }

func (e badInputError) Error() string  { return e.err.Error() }
func (e badInputError) Unwrap() error  { return e.err }
func (e badInputError) BadInput() bool { return true }

// badInput wraps err (or a formatted message) as bad input.
func badInput(format string, args ...any) error {
	return badInputError{fmt.Errorf(format, args...)}
}

// isBadInput reports whether any error in the chain says it is bad input.
// Packages below cmd opt in by implementing BadInput() bool, without
// importing anything from here.
func isBadInput(err error) bool {
	var b interface{ BadInput() bool }
	return errors.As(err, &b) && b.BadInput()
}

func init() {
	rootCmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return badInputError{fmt.Errorf("%w (see '%s --help')", plainFlagError(err), c.CommandPath())}
	})
}

// flagValueError is the parser's word for a flag's value it could not
// read: invalid argument "-1" for "--seed" flag: strconv.ParseUint: ...
var flagValueError = regexp.MustCompile(`^invalid argument (".*") for "(.*)" flag: (.*)$`)

// flagTakes says what a flag takes after the words of the parser's
// refusal its value's error holds: the first that matches.
var flagTakes = []struct{ refusal, takes string }{
	{"value out of range", "is out of range"},
	{"strconv.ParseUint", "is not a whole number of 0 or more"},
	{"strconv.ParseInt", "is not a whole number"},
	{"strconv.ParseFloat", "is not a number"},
	{"strconv.ParseBool", "is not true or false"},
	{"time: ", "is not a duration such as 30s, 5m or 1h30m"},
}

// plainFlagError says what a flag takes where the parser's error names the
// Go function that refused its value (strconv.ParseUint: parsing "-1":
// invalid syntax); any other error is left as it is.
func plainFlagError(err error) error {
	m := flagValueError.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	value, flag, why := m[1], m[2], m[3]
	if strings.HasPrefix(why, "time: ") && durlimit.Past(strings.Trim(value, `"`)) {
		return fmt.Errorf("%s %s is out of range: %s", flag, value, durlimit.Longest)
	}
	for _, t := range flagTakes {
		if strings.Contains(why, t.refusal) {
			return fmt.Errorf("%s %s %s", flag, value, t.takes)
		}
	}
	return err
}

// strictArgs makes wrong arguments bad input (exit 2, one line) on every
// command under c: cobra's own checks (cobra.NoArgs, MaximumNArgs) return
// plain errors, which exited 1, and a command that only groups others
// (sched tokenizer) printed its help and exited 0 for a name it does not
// know. Such a command now refuses the name, with cobra's suggestions, and
// prints its help when given none.
func strictArgs(c *cobra.Command) {
	for _, sub := range c.Commands() {
		strictArgs(sub)
	}
	if !c.HasParent() {
		return // the root: cobra reports an unknown command itself
	}
	if c.Name() == "help" && c.Parent() == c.Root() {
		// cobra's help prints "Unknown help topic" and the usage, and
		// exits 0, for a topic it does not know.
		c.Args = func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			topic, rest, err := c.Root().Find(args)
			if err == nil && len(rest) == 0 {
				return nil
			}
			if topic != nil && topic != c.Root() && len(rest) > 0 {
				if e := didYouMean(topic, rest[0]); e != nil {
					return e
				}
				return argsError{fmt.Errorf("no help topic %q under '%s' (see '%s --help')", rest[0], topic.CommandPath(), topic.CommandPath())}
			}
			return argsError{fmt.Errorf("no help topic %q: 'sched help' takes a command's name (see 'sched --help')", strings.Join(args, " "))}
		}
		return
	}
	if c.HasSubCommands() && !c.Runnable() {
		c.Args = func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			var names []string
			for _, sub := range c.Commands() {
				if sub.IsAvailableCommand() {
					names = append(names, sub.Name())
				}
			}
			if err := didYouMean(c, args[0]); err != nil {
				return err
			}
			return argsError{fmt.Errorf("unknown command %q for '%s': use %s (see '%s --help')",
				args[0], c.CommandPath(), strings.Join(names, ", "), c.CommandPath())}
		}
		c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		return
	}
	if check := c.Args; check != nil {
		c.Args = func(c *cobra.Command, args []string) error {
			err := check(c, args)
			if err == nil {
				return nil
			}
			// A command that also runs on its own (sched datasets) read a
			// mistyped subcommand as an argument.
			if c.HasSubCommands() && len(args) > 0 {
				if e := didYouMean(c, args[0]); e != nil {
					return e
				}
			}
			if isBadInput(err) {
				return err
			}
			if !strings.Contains(err.Error(), c.CommandPath()) {
				err = fmt.Errorf("%s: %w", c.CommandPath(), err)
			}
			return argsError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
		}
	}
}

// didYouMean is the error for name under c when it is close to one of c's
// subcommands' names (cobra's suggestions), else nil.
func didYouMean(c *cobra.Command, name string) error {
	if c.SuggestionsMinimumDistance <= 0 {
		c.SuggestionsMinimumDistance = 2 // cobra's default, set only where it suggests itself
	}
	s := c.SuggestionsFor(name)
	if len(s) == 0 {
		return nil
	}
	return argsError{fmt.Errorf("unknown command %q for '%s': did you mean %s? (see '%s --help')",
		name, c.CommandPath(), strings.Join(s, " or "), c.CommandPath())}
}

// argsError is returned by exactArgs and friends.
type argsError struct{ error }

func (argsError) BadInput() bool { return true }

// exactArgs is cobra.ExactArgs with a message that says what to pass.
func exactArgs(n int, what string) cobra.PositionalArgs { return rangeArgs(n, n, what) }

// maxArgs is cobra.MaximumNArgs with exactArgs's messages: what stands for
// what the command takes ("at most one task id").
func maxArgs(n int, what string) cobra.PositionalArgs { return rangeArgs(0, n, what) }

// rangeArgs takes from least to most arguments, saying what to pass where
// it is given another number, and how to give a switch's value where a
// word typed after the switch was read as an argument: one too many, or an
// empty one (--s3-secure "", an unset shell variable), which no command
// takes and which a command of one argument read as that argument.
func rangeArgs(least, most int, what string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		for i, a := range args {
			if i < most && a != "" {
				continue
			}
			// A word after a switch: say how to give its value, which
			// the count of arguments would not.
			if sw := switchBefore(c, os.Args[1:], a); sw != "" {
				return switchWordError(c, sw, a, what)
			}
		}
		if len(args) < least || len(args) > most {
			got := "none"
			if len(args) > 0 {
				// Named: a word taken as an argument is often a flag's value
				// written after a switch (--s3-secure maybe).
				got = fmt.Sprintf("%d: %q", len(args), args)
			}
			return argsError{fmt.Errorf("%s expects %s (got %s); see '%s --help'", c.CommandPath(), what, got, c.CommandPath())}
		}
		return nil
	}
}

// switchWordError is the error of command c, which expects what, where
// word, typed right after switch sw (a flag that alone means true), was
// read as an argument of c: the switch's value follows '='.
func switchWordError(c *cobra.Command, sw, word, what string) error {
	typed := word
	if word == "" {
		typed = `""`
	}
	return argsError{fmt.Errorf("%s %s: the flag's value follows '=', so %q here is read as an argument of '%s', which expects %s; write %s=<value> (true or false; %s alone is true) (see '%s --help')",
		sw, typed, word, c.CommandPath(), what, sw, sw, c.CommandPath())}
}
