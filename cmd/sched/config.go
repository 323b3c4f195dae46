package main

// Configuration for every sched command.
//
// Other commands get the resolved configuration and their connections
// through three functions of this file:
//
//	cfg, err := loadConfig(cmd)        // scheduler.Config: flags > env > config file > defaults, validated
//	q, err := openQueue(ctx, cfg)      // *scheduler.Client, Redis checked (bad URL or unreachable: exit 2)
//	st, err := openStore(ctx, cfg)     // store.Store: S3 when KILN_S3_ENDPOINT is set, else DataDir/objects
//	st, err := openStoreToRead(ctx, cfg, what) // the same, for a command that only reads: no bucket is exit 2
//	log := logger(cfg)              // zap: JSON in containers, console on a terminal
//
// Precedence: a flag given on the command line wins over the environment
// variable, which wins over the config file (--config, KILN_CONFIG, or
// $XDG_CONFIG_HOME/kiln/config.yaml, ~/.config/kiln/config.yaml without
// XDG_CONFIG_HOME, when it exists), which wins over the defaults in
// scheduler.Config.WithDefaults. Every error names the setting to fix.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/term"
	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/durlimit"
	"github.com/kiln-lm/kiln/internal/redact"
	"github.com/kiln-lm/kiln/internal/yamlstrict"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// setting binds one Config field to its flag and environment variable.
type setting struct {
	flag, env, help string
	get             func(*scheduler.Config) string
	set             func(*scheduler.Config, string) error
}

func str(p func(*scheduler.Config) *string) (func(*scheduler.Config) string, func(*scheduler.Config, string) error) {
	return func(c *scheduler.Config) string { return *p(c) },
		func(c *scheduler.Config, v string) error { *p(c) = v; return nil }
}

var settings = func() []setting {
	mk := func(flag, env, help string, p func(*scheduler.Config) *string) setting {
		g, s := str(p)
		return setting{flag, env, help, g, s}
	}
	return []setting{
		mk("redis-url", "KILN_REDIS_URL", "queue Redis URL, redis://[[user]:password@]host:port/db (default "+scheduler.DefaultRedisURL+")", func(c *scheduler.Config) *string { return &c.RedisURL }),
		mk("s3-endpoint", "KILN_S3_ENDPOINT", "S3 endpoint host:port; empty for the local directory store", func(c *scheduler.Config) *string { return &c.S3Endpoint }),
		mk("s3-bucket", "KILN_S3_BUCKET", "S3 bucket (default kiln)", func(c *scheduler.Config) *string { return &c.S3Bucket }),
		mk("s3-access-key", "KILN_S3_ACCESS_KEY", "S3 access key", func(c *scheduler.Config) *string { return &c.S3AccessKey }),
		mk("s3-secret-key", "KILN_S3_SECRET_KEY", "S3 secret key (prefer the environment)", func(c *scheduler.Config) *string { return &c.S3SecretKey }),
		{"s3-secure", "KILN_S3_SECURE", "use https for S3 (default false; --s3-secure alone: true)",
			func(c *scheduler.Config) string { return strconv.FormatBool(c.S3Secure) },
			func(c *scheduler.Config, v string) error {
				b, err := parseSwitch(v)
				if err != nil {
					return err
				}
				c.S3Secure = b
				return nil
			}},
		mk("data-dir", "KILN_DATA_DIR", "local data directory (default ./.kiln)", func(c *scheduler.Config) *string { return &c.DataDir }),
		{"local-roots", "KILN_LOCAL_ROOTS", "directories a worker may read local dataset files from, separated as in PATH (default: the data directory)",
			func(c *scheduler.Config) string { return strings.Join(c.LocalRoots, string(os.PathListSeparator)) },
			func(c *scheduler.Config, v string) error { c.LocalRoots = filepath.SplitList(v); return nil }},
		mk("hf-token", "HF_TOKEN", "Hugging Face token for gated datasets (prefer the environment)", func(c *scheduler.Config) *string { return &c.HFToken }),
		mk("tokenizer", "KILN_TOKENIZER", "default tokenizer name, what ingests tokenize with (default "+scheduler.DefaultTokenizer+")", func(c *scheduler.Config) *string { return &c.Tokenizer }),
		{"shutdown-grace", "KILN_SHUTDOWN_GRACE", "time in-flight tasks get to stop after SIGTERM: a positive duration such as 30s or 5m (default 30s)",
			func(c *scheduler.Config) string { return c.ShutdownGrace.String() },
			func(c *scheduler.Config, v string) error {
				d, err := time.ParseDuration(v)
				if err != nil && durlimit.Past(v) {
					return fmt.Errorf("%q is out of range: %s", v, durlimit.Longest)
				}
				if err != nil {
					return fmt.Errorf("%q is not a duration like 30s or 5m", v)
				}
				// Given, so never "unset": a zero stored here would become
				// the default unnoticed.
				if d <= 0 {
					return fmt.Errorf("%q is not positive: %s", v, scheduler.ShutdownGraceHint)
				}
				c.ShutdownGrace = d
				return nil
			}},
		mk("log-format", "KILN_LOG_FORMAT", "log format: json, console or auto, console on a terminal (default auto)", func(c *scheduler.Config) *string { return &c.LogFormat }),
		mk("metrics-addr", "KILN_METRICS_ADDR", "where sched worker serves Prometheus metrics, host:port (e.g. :9400; off when empty)", func(c *scheduler.Config) *string { return &c.MetricsAddr }),
	}
}()

// emptyFlagMeans names the flags whose empty value is a setting of its
// own: the local directory store, no key or token, metrics off. Any other
// flag given empty is refused: it would be the default unnoticed, over
// the environment's value too (an unset shell variable in --data-dir
// "$DIR" would write to ./.kiln, --tokenizer "$TOK" ingest with mix-16384).
var emptyFlagMeans = map[string]bool{"s3-endpoint": true, "s3-access-key": true, "s3-secret-key": true, "hf-token": true, "metrics-addr": true}

// switchWords are the words an on/off setting takes, in any case, from
// every source alike: its variable, its flag and its config file key
// (KILN_S3_SECURE, --s3-secure, s3_secure; KILN_REQUIRE_GPU). Each source
// read booleans by its own parser (strconv's took 1 and t but not yes, the
// YAML file's yes and on but not 1), so one value worked in one place and
// was refused in another.
const switchWords = "true, yes, on or 1, or false, no, off or 0 (in any case)"

// parseSwitch reads v, the value of an on/off setting, as switchWords says.
func parseSwitch(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "true", "yes", "on", "1":
		return true, nil
	case "false", "no", "off", "0":
		return false, nil
	}
	return false, fmt.Errorf("%q is not true or false: write %s", v, switchWords)
}

// givenEmptyKey is the annotation noEmpty puts on a command's flag: what
// to give it, and what leaving it out means.
const givenEmptyKey = "kiln/given-empty"

// noEmpty marks the flag name of fs as one whose empty value is no setting
// of its own, as emptyFlagMeans does for the global flags: given empty (an
// unset shell variable in --stores "$DIR"), it would mean its default
// unnoticed, over the environment's value too. give says what to give it,
// def what leaving it out means; refuseGivenEmpty, run before every
// command (the root's PersistentPreRunE), refuses it.
func noEmpty(fs *pflag.FlagSet, name, give, def string) {
	if err := fs.SetAnnotation(name, givenEmptyKey, []string{give, def}); err != nil {
		panic(err) // a flag's name mistyped here: every run of sched would say so
	}
}

// refuseGivenEmpty refuses, as bad input, a flag of cmd that noEmpty
// marked and that was given empty (one its parent declares for it
// included). The root runs it before every command, so that the flag is
// refused before the command reads anything.
func refuseGivenEmpty(cmd *cobra.Command, _ []string) error {
	var err error
	// After parsing, cmd.Flags() holds its parents' persistent flags too.
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if a, ok := f.Annotations[givenEmptyKey]; ok && err == nil && f.Value.String() == "" {
			err = badInput("flag --%s is given empty: give %s, or leave it out to use %s", f.Name, a[0], a[1])
		}
	})
	return err
}

// dataDirPathError refuses path, which the command found under the data
// directory dataDir as no flag of its own named it, for err: it names what
// set the data directory, which is what the user gave, and the command's
// flag (flag) that names the directory instead. what says what path is.
func dataDirPathError(cmd *cobra.Command, dataDir, what, path, flag string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is said once, below
	}
	from, fix := "the data directory "+dataDir+" (the config file's data_dir, or the default ./.kiln)", "--data-dir or KILN_DATA_DIR"
	if _, ok := flagValue(cmd, "data-dir"); ok {
		from, fix = "--data-dir "+dataDir, "--data-dir"
	} else if name, v := envSetting("KILN_DATA_DIR"); v != "" {
		from, fix = name+" "+dataDir, name
	}
	return badInput("%s %s, under %s: %v: make it a directory this user can read, give %s another data directory, or name the %s with %s",
		what, path, from, err, fix, what, flag)
}

// checkSwitchWords refuses a word given after a switch (a flag that alone
// means true: every bool flag, and --s3-secure) as an argument of its own,
// where it reads as true or false or where it is read as a command's name.
// The parser leaves such a word to the command: "--s3-secure false" meant
// https and a task or run named "false", "--resume false" a resume, and
// "sched --s3-secure maybe config" was an unknown command "maybe". It
// reads the arguments as typed, before the command parses them, since a
// command that takes no arguments would otherwise refuse the word without
// saying how to give the value.
func checkSwitchWords(args []string) error {
	cmd, _, err := rootCmd.Find(args)
	if err != nil {
		// A word before the command ("--s3-secure off results") reads as
		// an unknown command: the root's switches are every command's.
		cmd = rootCmd
	}
	unknown, group := unknownCommandWord(args)
	for i, a := range args {
		if a == "--" {
			return nil // what follows is the command's arguments, as given
		}
		name, ok := strings.CutPrefix(a, "--")
		if !ok || i+1 == len(args) {
			continue
		}
		f := cmd.Flag(name)
		if f == nil || f.NoOptDefVal == "" {
			continue
		}
		w := args[i+1]
		switch strings.ToLower(w) {
		case "false", "no", "0", "off":
			return badInput("%s %s: the flag's value follows '=', so %q here is read as an argument of the command; write %s=false", a, w, w, a)
		case "true", "yes", "1", "on":
			return badInput("%s %s: the flag's value follows '=', so %q here is read as an argument of the command; write %s=true (or %s alone)", a, w, w, a, a)
		}
		if i+1 == unknown {
			// Any other word, where a command's name goes: the flag's
			// value meant, or a command mistyped after the switch.
			msg := fmt.Sprintf("%s %s: the flag's value follows '=', so %q here is read as a command, and '%s' has none of that name; write %s=<value> (true or false; %s alone is true), then the command",
				a, w, w, group.CommandPath(), a, a)
			if group.SuggestionsMinimumDistance <= 0 {
				group.SuggestionsMinimumDistance = 2 // cobra's default, set only where it suggests itself
			}
			if s := group.SuggestionsFor(w); len(s) > 0 {
				msg += fmt.Sprintf(", or did you mean %s?", strings.Join(s, " or "))
			}
			return badInput("%s (see '%s --help')", msg, group.CommandPath())
		}
	}
	return nil
}

// switchBefore finds, in the words typed (raw), a switch of cmd that word
// directly follows: the word, taken as an argument the command does not
// take, was most likely the switch's value. Empty where none does.
func switchBefore(cmd *cobra.Command, raw []string, word string) string {
	for i := 0; i+1 < len(raw) && raw[i] != "--"; i++ {
		name, ok := strings.CutPrefix(raw[i], "--")
		if !ok || raw[i+1] != word {
			continue
		}
		if f := cmd.Flag(name); f != nil && f.NoOptDefVal != "" {
			return raw[i]
		}
	}
	return ""
}

// unknownCommandWord finds the word of args that is read as an unknown
// command: the first word that is neither a flag, a flag's value, nor the
// name of a command, where the command named so far has commands of its
// own and takes no such argument. It returns its index, -1 for none, and
// the command whose commands it is not.
func unknownCommandWord(args []string) (int, *cobra.Command) {
	cmd := rootCmd
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "-") {
			// A flag's value is the next word unless it follows '=' or
			// the flag is a switch; cobra skips it so when it finds the
			// command, and so does this.
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") || (!strings.HasPrefix(a, "--") && len(name) != 1) {
				continue
			}
			var f *pflag.Flag
			if strings.HasPrefix(a, "--") {
				f = cmd.Flag(name)
			} else {
				f = cmd.Flags().ShorthandLookup(name)
				if f == nil {
					f = cmd.InheritedFlags().ShorthandLookup(name)
				}
			}
			if f == nil || f.NoOptDefVal == "" {
				i++
			}
			continue
		}
		sub := commandNamed(cmd, a)
		if sub == nil {
			// The root takes no arguments; a group (sched tokenizer), or
			// a command that also runs alone (sched datasets), refuses
			// a word it does not take as a command it does not have.
			if cmd == rootCmd || cmd.HasSubCommands() && cmd.ValidateArgs([]string{a}) != nil {
				return i, cmd
			}
			break // an argument of the command
		}
		cmd = sub
	}
	return -1, cmd
}

// commandNamed is the subcommand of cmd that name names, by its name or an
// alias; nil if none.
func commandNamed(cmd *cobra.Command, name string) *cobra.Command {
	for _, sub := range cmd.Commands() {
		if sub.Name() == name || sub.HasAlias(name) {
			return sub
		}
	}
	return nil
}

// quietRedis drops go-redis's own log lines: its failures reach us as
// errors, which sched reports once, on one line.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() {
	redis.SetLogger(quietRedis{})
	pf := rootCmd.PersistentFlags()
	pf.String("config", "", "config file (YAML; default $KILN_CONFIG, else $XDG_CONFIG_HOME/kiln/config.yaml if present; XDG_CONFIG_HOME defaults to ~/.config)")
	for _, s := range settings {
		pf.String(s.flag, "", s.help+" ["+s.env+"]")
	}
	// An on/off setting is a switch on the command line, as a bool flag is:
	// --s3-secure alone means true (--s3-secure=false turns it off; main
	// refuses "--s3-secure false", as it does for every switch).
	pf.Lookup("s3-secure").NoOptDefVal = "true"
	var check bool
	cfgCmd := &cobra.Command{
		Use:   "config",
		Short: "Print the resolved configuration, secrets masked (--check: also the GPU, Redis and the object store)",
		Example: `  sched config
  sched config --check
  KILN_RUNS=runs.yaml sched config`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			m := cfg.Masked()
			w := cmd.OutOrStdout()
			for _, s := range settings {
				fmt.Fprintf(w, "%-20s %-16s %s\n", s.env, s.flag, s.get(&m))
			}
			for _, s := range envOnly {
				// A mirror's URL may hold a password, which is masked.
				v := redact.URL(os.Getenv(s.env))
				if v == "" {
					v = "(" + s.unset + ")"
				}
				fmt.Fprintf(w, "%-20s %-16s %s\n", s.env, "-", v)
			}
			// The GPU worker reads these two at its start: a value it would
			// refuse is refused here too.
			gpus, err := workerGPUs(os.Getenv("KILN_GPUS"))
			if err != nil {
				return err
			}
			require, err := envBool("KILN_REQUIRE_GPU")
			if err != nil {
				return err
			}
			if err := checkEnvOnly(cfg); err != nil {
				return err
			}
			if !check {
				return nil
			}
			// The machine's own part first: it needs no server, and a
			// GPU that does not start does not keep the servers unchecked.
			gpuErr := checkGPU(w, require, gpus)
			q, _, err := openQueue(cmd.Context(), cfg)
			if err != nil {
				return errors.Join(gpuErr, err)
			}
			q.Close()
			st, err := openStoreUnchecked(cfg)
			if err != nil {
				return errors.Join(gpuErr, err)
			}
			bucket := true
			if s3, ok := st.(*store.S3); ok {
				if bucket, err = checkStore(cmd.Context(), cfg, s3); err != nil {
					return errors.Join(gpuErr, err)
				}
			}
			if !bucket {
				// No error: the first write creates the bucket, which a
				// fresh setup relies on. But a mistyped name would be
				// created the same way, unnoticed, so it is said here.
				fmt.Fprintf(w, "redis and object store reachable, but %s: %s\n", noBucket(cfg), noBucketFix)
				return gpuErr
			}
			fmt.Fprintln(w, "redis and object store reachable")
			return gpuErr
		},
	}
	cfgCmd.Flags().BoolVar(&check, "check", false, "also say what engine auto trains on here (the GPUs, the CUDA driver and libraries) and connect to Redis and the object store")
	rootCmd.AddCommand(cfgCmd)
}

// loadConfig resolves the configuration for cmd: defaults, then the config
// file, then the environment, then flags given on the command line.
func loadConfig(cmd *cobra.Command) (cfg scheduler.Config, err error) {
	defer func() { err = redactErr(cfg, err) }()
	path, explicit := flagValue(cmd, "config")
	// What names the file, and what to do where it cannot be read.
	from, instead := "--config", `give the path of a YAML config file, or --config "" to read none`
	if !explicit {
		if p := os.Getenv("KILN_CONFIG"); p != "" {
			path, explicit = p, true
			from, instead = "KILN_CONFIG", "set it to the path of a YAML config file, or unset it"
		} else {
			path = scheduler.DefaultConfigPath()
			from, instead = "read without --config or KILN_CONFIG", `make it a readable YAML file, remove it, or give --config "" to read none`
		}
	}
	var fromFile fileKeys
	if path != "" {
		b, err := os.ReadFile(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !explicit:
		case errors.Is(err, fs.ErrNotExist):
			return cfg, badInput("config file %s (%s) does not exist: %s", path, from, instead)
		case err != nil:
			return cfg, badInput("config file %s (%s): %v: %s", path, from, err, instead)
		default:
			if err := decodeConfigFile(b, &cfg); err != nil {
				// A grace of 0 or less with no unit: written with one, it
				// would be refused next as not positive, so say that now.
				var de *yamlstrict.DurationError
				if errors.As(err, &de) && de.Key == "shutdown_grace" && de.Number {
					if f, ferr := strconv.ParseFloat(de.Value, 64); ferr == nil && f <= 0 {
						return cfg, badInput("config file %s: shutdown_grace: %s is not positive: %s", path, de.Value, scheduler.ShutdownGraceHint)
					}
				}
				return cfg, badInput("config file %s: %s", path, strings.ReplaceAll(err.Error(), "\n", "; "))
			}
			fromFile.path = path
			_ = yaml.Unmarshal(b, &fromFile.keys)
		}
	}
	for _, s := range settings {
		if name, v := envSetting(s.env); v != "" {
			if err := s.set(&cfg, v); err != nil {
				return cfg, badInput("environment %s: %v", name, err)
			}
		}
		if v, ok := flagValue(cmd, s.flag); ok {
			if v == "" && !emptyFlagMeans[s.flag] {
				return cfg, badInput("flag --%s is given empty: give it a value, or leave it out to use %s, the config file or the default", s.flag, s.env)
			}
			if err := s.set(&cfg, v); err != nil {
				return cfg, badInput("flag --%s: %v", s.flag, err)
			}
		}
	}
	cfg.HFTokenFrom = hubTokenFrom(cmd, cfg.HFToken, fromFile)
	// The file's zero grace, where nothing above it set one: WithDefaults
	// would read it as unset (the flag and the variable refuse their own).
	// A key left empty is unset, as an empty variable is.
	if v, given := fromFile.keys["shutdown_grace"]; given && v != nil && cfg.ShutdownGrace == 0 {
		return cfg, badInput("config file %s: shutdown_grace: 0s is not positive: %s", fromFile.path, scheduler.ShutdownGraceHint)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return cfg, settingError(cmd, err, fromFile)
	}
	return cfg, nil
}

// decodeConfigFile decodes the config file b onto cfg, its on/off keys
// (s3_secure) read as their variables are (parseSwitch): YAML's own bool
// takes yes and on but refuses 1 and "true", in words that name no key.
func decodeConfigFile(b []byte, cfg *scheduler.Config) error {
	doc, err := yamlstrict.Parse(b)
	if err != nil || len(doc.Content) == 0 {
		return err
	}
	if m := doc.Content[0]; m.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if key := m.Content[i].Value; configSwitches[key] {
				if err := readSwitch(m.Content[i+1], key); err != nil {
					return err
				}
			}
		}
	}
	return yamlstrict.Decode(doc, cfg)
}

// configSwitches are the config file's keys of on/off settings: those of
// scheduler.Config's bool fields.
var configSwitches = func() map[string]bool {
	keys := map[string]bool{}
	t := reflect.TypeFor[scheduler.Config]()
	for i := range t.NumField() {
		if f := t.Field(i); f.Type.Kind() == reflect.Bool {
			if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name != "" {
				keys[name] = true
			}
		}
	}
	return keys
}()

// readSwitch reads n, the value of the config file's on/off key, by
// parseSwitch, and leaves it a plain true or false for yaml to decode. A
// key left empty stays unset, as an empty variable does.
func readSwitch(n *yaml.Node, key string) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %s: write %s, not a list or a mapping", n.Line, key, switchWords)
	}
	if n.ShortTag() == "!!null" {
		return nil
	}
	b, err := parseSwitch(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %s: %w", n.Line, key, err)
	}
	n.Value, n.Tag, n.Style = strconv.FormatBool(b), "!!bool", 0
	return nil
}

// olderNames are the variables read for a setting where its own is unset
// or empty: HUGGING_FACE_HUB_TOKEN is HF_TOKEN's older name, which
// huggingface_hub still reads.
var olderNames = map[string]string{"HF_TOKEN": "HUGGING_FACE_HUB_TOKEN"}

// envSetting is the environment's value for the setting of variable env,
// and the variable it came from: env's own, else its older name's; "" when
// neither is set.
func envSetting(env string) (name, value string) {
	if v := os.Getenv(env); v != "" {
		return env, v
	}
	if old := olderNames[env]; old != "" {
		if v := os.Getenv(old); v != "" {
			return old, v
		}
	}
	return env, ""
}

// hubTokenFrom is what gave token, the Hub token loadConfig read for cmd,
// where --hf-token or the config file (file) did: the flag's note names
// the variable also set that it was read over, or, given empty (no
// token), the one it keeps from being read. Zero where the environment
// gave it: hub.Environment names the variable.
func hubTokenFrom(cmd *cobra.Command, token string, file fileKeys) hub.TokenSource {
	env := hub.Environment()
	var from hub.TokenSource
	if _, ok := flagValue(cmd, "hf-token"); ok {
		from.Name = "--hf-token"
		switch {
		case token != "" && env.Token != "":
			from.Note = "read over " + env.TokenFrom.Setting() + ", also set"
		case token == "" && env.Token != "":
			from.Note = "given empty, so " + env.TokenFrom.Setting() + " is not read"
		case token == "":
			from.Note = "given empty"
		}
	} else if token != "" && env.Token == "" {
		from.Name = "hf_token in " + file.path
	}
	return from
}

// envOnly are the settings read from the environment alone, which `sched
// config` prints after the others: what each is, unset.
var envOnly = []struct{ env, unset string }{
	{"KILN_RUNS", "unset: the preset runs only"},
	{"KILN_DATASETS", "unset: the preset datasets only"},
	{"KILN_GPUS", "unset: 1"},
	{"KILN_REQUIRE_GPU", "unset: false"},
	{"KILN_NCCL_BUCKET_MB", "unset: off, one all-reduce after the backward"},
	{"HF_ENDPOINT", "unset: " + hub.DefaultEndpoint},
}

// checkEnvOnly refuses, as the commands that read them would, an
// HF_ENDPOINT that is no http(s) URL (every ingest, and a CPU worker at its
// start), a KILN_RUNS file that does not read as runs or holds a run that
// could never train (sched enqueue train, and the GPU worker at its start) and a KILN_DATASETS file that does not
// read as presets (sched ingest, enqueue ingest and enqueue tokenizer).
func checkEnvOnly(cfg scheduler.Config) error {
	if _, err := hub.New(hubConfig(cfg)); err != nil {
		return err
	}
	set, err := loadRuns()
	if err != nil {
		return err
	}
	// A run that reads but could never train, as sched enqueue train
	// would refuse it.
	for _, name := range set.Names() {
		run, err := set.Get(name)
		if err == nil {
			var mc model.Config
			if mc, err = run.RunConfig.ModelConfig(); err == nil {
				err = fitsLargestCard(run.RunConfig, mc)
			}
			if err != nil {
				err = fmt.Errorf("run %s: %w", name, runs.SizeAdvice(name, err))
			}
		}
		if err != nil {
			return invalidRun(err)
		}
	}
	if _, err := ingest.Presets(""); err != nil {
		return badInput("KILN_DATASETS: %v", err)
	}
	return nil
}

// loadRuns reads the runs there are: the presets, with KILN_RUNS's file
// applied where it is set; a file that does not read is bad input naming
// it and what to do.
func loadRuns() (runs.Set, error) {
	set, err := runs.Load(os.Getenv("KILN_RUNS"))
	if err != nil {
		return nil, badInput("KILN_RUNS: %v; fix the file or its path, or unset KILN_RUNS for the preset runs alone", err)
	}
	return set, nil
}

// getRun is set's run name (runs.Set.Get), a run there that could never
// train refused as invalidRun says.
func getRun(set runs.Set, name string) (runs.Run, error) {
	run, err := set.Get(name)
	if _, known := set[name]; err != nil && known {
		return runs.Run{}, invalidRun(err)
	}
	return run, err
}

// invalidRun is err, of a run that reads but could never train, as bad
// input naming the runs file it comes from (the presets all train) and
// what to do.
func invalidRun(err error) error {
	return badInput("KILN_RUNS %s: %v; fix the run in the file ('sched runs --presets' lists every run and whether it is valid)", os.Getenv("KILN_RUNS"), err)
}

// fileKeys is the config file read and the keys it sets.
type fileKeys struct {
	path string
	keys map[string]any
}

// settingError names a setting Validate refused as the user gave it: by
// its flag, its environment variable, or its key in the config file,
// whichever set the value (ConfigError names the variable and the flag,
// which is what it says when none did).
func settingError(cmd *cobra.Command, err error, file fileKeys) error {
	var ce *scheduler.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	for _, s := range settings {
		if s.env != ce.Env {
			continue
		}
		if _, ok := flagValue(cmd, s.flag); ok {
			return badInput("--%s: %s", s.flag, ce.Msg)
		}
		if name, v := envSetting(s.env); v != "" {
			return badInput("%s: %s", name, ce.Msg)
		}
		key := strings.ReplaceAll(s.flag, "-", "_")
		if _, ok := file.keys[key]; ok {
			return badInput("config file %s: %s: %s", file.path, key, ce.Msg)
		}
	}
	return err
}

func flagValue(cmd *cobra.Command, name string) (string, bool) {
	f := cmd.Flags().Lookup(name)
	if f == nil {
		f = cmd.InheritedFlags().Lookup(name)
	}
	if f == nil || !f.Changed {
		return "", false
	}
	return f.Value.String(), true
}

// commandQueue is openQueue for a command that needs only the queue: the
// configuration its flags and environment give, and the client.
func commandQueue(cmd *cobra.Command) (*scheduler.Client, error) {
	cfg, err := loadConfig(cmd)
	if err != nil {
		return nil, err
	}
	q, _, err := openQueue(cmd.Context(), cfg)
	return q, err
}

// openQueue connects to Redis and checks that it answers, so that a wrong
// URL fails here with one clear line instead of in a retry loop.
func openQueue(ctx context.Context, cfg scheduler.Config) (*scheduler.Client, asynq.RedisConnOpt, error) {
	opt, err := cfg.RedisOpt()
	if err != nil {
		// The parser's error quotes the URL, password and all.
		return nil, nil, badInput("KILN_REDIS_URL %s: %v", cfg.Masked().RedisURL, redactErr(cfg, err))
	}
	c := scheduler.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx); err != nil {
		c.Close()
		if m := err.Error(); strings.HasPrefix(m, "WRONGPASS") || strings.HasPrefix(m, "NOAUTH") {
			// Reached, and refused: the URL's credentials, not Redis's
			// address or health, are what to check.
			return nil, nil, badInput("Redis at %s (KILN_REDIS_URL or --redis-url) refused its credentials: %v; check the password in the URL, and its user name where Redis has ACL users", cfg.Masked().RedisURL, redactErr(cfg, err))
		}
		return nil, nil, badInput("cannot reach Redis at %s (KILN_REDIS_URL or --redis-url): %v; check the URL and that Redis is running", cfg.Masked().RedisURL, redactErr(cfg, err))
	}
	return c, opt, nil
}

// openStore returns the object store the configuration names. For S3 it
// checks the server and the credentials.
func openStore(ctx context.Context, cfg scheduler.Config) (store.Store, error) {
	s, _, err := openStoreBucket(ctx, cfg)
	return s, err
}

// openStoreBucket is openStore, saying too whether the bucket exists
// (always, for the local store).
func openStoreBucket(ctx context.Context, cfg scheduler.Config) (store.Store, bool, error) {
	s, err := openStoreUnchecked(cfg)
	if err != nil || cfg.S3Endpoint == "" {
		return s, err == nil, err
	}
	bucket, err := checkStore(ctx, cfg, s.(*store.S3))
	if err != nil {
		return nil, false, err
	}
	return s, bucket, nil
}

// openStoreToRead is openStore for a command that only reads what (the
// results of run pilot) from the store: a bucket that does not exist is
// refused, naming it: it is most likely a name mistyped here, or another
// than the workers write to (the default kiln, where they were given
// one). Read as a store that lacks what, it would say "not yet", and send
// the user to train again what the workers' bucket holds. Nothing is
// created: a command that writes opens the store with openStore and
// creates the bucket at its first write, as a fresh setup needs.
func openStoreToRead(ctx context.Context, cfg scheduler.Config, what string) (store.Store, error) {
	s, bucket, err := openStoreBucket(ctx, cfg)
	if err == nil && !bucket {
		return nil, badInput("%s, so it holds no %s: %s", noBucket(cfg), what, noBucketFix)
	}
	return s, err
}

// openStoreToList is openStore for a command that lists what object
// storage holds beside this machine's copies (what a listing holds, its
// plural: "tokenizers"): a bucket that does not exist lists as empty, and
// a note on errOut says why, naming it, where the listing would otherwise
// pass for all there is (a bucket mistyped here, while the workers write
// to another). Nothing is created.
func openStoreToList(ctx context.Context, cfg scheduler.Config, errOut io.Writer, what string) (store.Store, error) {
	s, bucket, err := openStoreBucket(ctx, cfg)
	if err == nil && !bucket {
		fmt.Fprintf(errOut, "note: %s, so no %s are listed from it (kiln creates it at the first write): if the workers write to another bucket, check KILN_S3_BUCKET (--s3-bucket)\n", noBucket(cfg), what)
	}
	return s, err
}

// noBucket says that cfg's bucket does not exist on its server.
func noBucket(cfg scheduler.Config) string {
	return fmt.Sprintf("bucket %s does not exist at %s", cfg.S3Bucket, s3Address(cfg))
}

// noBucketFix is what to do where the bucket does not exist.
const noBucketFix = "check KILN_S3_BUCKET (--s3-bucket); kiln creates it at the first write"

// openStoreUnchecked is openStore without the check of the server.
func openStoreUnchecked(cfg scheduler.Config) (store.Store, error) {
	if cfg.S3Endpoint == "" {
		return store.NewLocal(cfg.LocalStoreDir())
	}
	// The store's default tries of a request (S3Options.MaxRetries), with
	// their back-off, ride out a short burst of throttling or a dropped
	// connection, where a task would wait 30 s for an outage to end.
	s, err := store.NewS3(store.S3Options{Endpoint: cfg.S3Endpoint, Bucket: cfg.S3Bucket, AccessKey: cfg.S3AccessKey, SecretKey: cfg.S3SecretKey, Secure: cfg.S3Secure})
	if err != nil {
		return nil, redactErr(cfg, err)
	}
	return s, nil
}

// checkStore checks that the S3 server s answers and takes the
// credentials, and says whether the bucket exists (the first write creates
// it when it does not).
func checkStore(ctx context.Context, cfg scheduler.Config, s *store.S3) (bucket bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	bucket, err = s.Check(cctx)
	if err != nil {
		if isBadInput(err) || ctx.Err() != nil {
			return false, redactErr(cfg, err)
		}
		return false, badInput("cannot reach the object store at %s (KILN_S3_ENDPOINT or --s3-endpoint, https with KILN_S3_SECURE): %w; check the endpoint, http or https, and that it is running",
			s3Address(cfg), redactErr(cfg, err))
	}
	return bucket, nil
}

// s3Address is the S3 server's address for messages, scheme://endpoint,
// credentials masked.
func s3Address(cfg scheduler.Config) string {
	scheme := "http"
	if cfg.S3Secure {
		scheme = "https"
	}
	return scheme + "://" + cfg.Masked().S3Endpoint
}

// redactErr hides cfg's secrets in err's text, keeping what err wraps for
// errors.As (whether it is bad input, say): errors from libraries may
// quote the URL or the key they were given.
func redactErr(cfg scheduler.Config, err error) error { return redact.Err(err, cfg.Redact) }

// consoleLog says whether a log in format (KILN_LOG_FORMAT) written to w
// is readable lines, not JSON: console, or auto (or unset) on a terminal,
// while containers and CI get JSON.
func consoleLog(format string, w io.Writer) bool {
	if format != "auto" && format != "" {
		return format == "console"
	}
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// logger builds the zap logger, on stderr, in KILN_LOG_FORMAT's form. An
// error is one line in either form: no stack trace, which zap's presets add
// to every error (and the development preset to every warning), though a
// failed task is an event of the queue, not a fault of the code.
func logger(cfg scheduler.Config) *zap.Logger { return newLogger(os.Stderr, cfg.LogFormat) }

// newLogger writes to w in format (KILN_LOG_FORMAT): readable lines or
// JSON, as consoleLog says. Readable lines colour their level on a
// terminal only: console is also chosen for a file (sched worker >
// worker.log) or journald, where escape codes are noise.
func newLogger(w io.Writer, format string) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	if consoleLog(format, w) {
		enc.EncodeLevel = zapcore.CapitalLevelEncoder
		if isTerminal(w) {
			enc.EncodeLevel = zapcore.CapitalColorLevelEncoder
		}
		return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(w), zap.InfoLevel))
	}
	enc.TimeKey = "time" // as the worker's
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(w), zap.InfoLevel))
}
