package scheduler

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/hibiken/asynq"
	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/redact"
	"github.com/kiln-lm/kiln/store"
)

// PathList is a list of directories. In YAML it is a list, or one string
// of directories separated as in PATH, as KILN_LOCAL_ROOTS writes it.
type PathList []string

// UnmarshalYAML takes a sequence of strings or one PATH-like string.
func (p *PathList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*p = filepath.SplitList(n.Value)
		return nil
	}
	var l []string
	if n.Kind != yaml.SequenceNode || n.Decode(&l) != nil {
		return fmt.Errorf("line %d: give a list of directories, or one string of them separated by %q", n.Line, os.PathListSeparator)
	}
	*p = l
	return nil
}

// Config is kiln's resolved configuration, shared by every command and worker.
// Zero values mean "use the default"; WithDefaults resolves them in one place,
// and Validate names the field that is wrong. The environment variable that
// sets each field is given in its comment; see cmd/sched/config.go for the
// precedence (flags over environment over config file).
type Config struct {
	// RedisURL locates the queue's Redis: redis://[:password@]host:port[/db]
	// or rediss:// for TLS. KILN_REDIS_URL. Default redis://127.0.0.1:6379/0.
	RedisURL string `yaml:"redis_url"`

	// S3Endpoint is the object store's host:port (no scheme). Empty means the
	// local directory store under DataDir/objects. KILN_S3_ENDPOINT.
	S3Endpoint string `yaml:"s3_endpoint"`
	// S3Bucket is the one bucket kiln writes to. KILN_S3_BUCKET. Default "kiln".
	S3Bucket string `yaml:"s3_bucket"`
	// S3AccessKey and S3SecretKey are the object store's credentials.
	// KILN_S3_ACCESS_KEY, KILN_S3_SECRET_KEY.
	S3AccessKey string `yaml:"s3_access_key"`
	S3SecretKey string `yaml:"s3_secret_key"`
	// S3Secure selects https. KILN_S3_SECURE. Default false (the compose
	// stack's MinIO speaks plain http on its private network).
	S3Secure bool `yaml:"s3_secure"`

	// DataDir holds local state: token stores, downloads, the local object
	// store. KILN_DATA_DIR. Default ./.kiln.
	DataDir string `yaml:"data_dir"`
	// LocalRoots are the directories whose files a worker may read for a
	// local dataset (local:<glob>) named in a task: payloads come from
	// whoever can write to Redis, so no other local path is read.
	// KILN_LOCAL_ROOTS, a list like PATH (':'-separated on Unix); YAML
	// local_roots, a list or such a string. Default: DataDir alone. The
	// command line's own datasets (sched ingest --direct, sched demo) are
	// confined to their glob's directory instead.
	LocalRoots PathList `yaml:"local_roots"`
	// HFToken authenticates Hugging Face Hub downloads (gated datasets). HF_TOKEN.
	HFToken string `yaml:"hf_token"`
	// HFTokenFrom is what gave HFToken, where the flag or the config file
	// did (zero: the environment's variable, which hub.Environment names),
	// for the Hub's refusals to name what to change.
	HFTokenFrom hub.TokenSource `yaml:"-"`
	// Tokenizer is the default tokenizer name (tokenizers/<name>/tokenizer.json
	// in the object store). KILN_TOKENIZER. Default "mix-16384", the
	// tokenizer the pilot and long runs train with.
	Tokenizer string `yaml:"tokenizer"`

	// ShutdownGrace is how long a worker lets in-flight tasks reach a safe
	// point after SIGTERM before it re-queues them. KILN_SHUTDOWN_GRACE.
	// Default 30s; the GPU worker's compose service sets more, to checkpoint.
	// Zero here means unset, so sched refuses a grace given as zero (or
	// less) where it reads it, as ShutdownGraceHint says.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// LogFormat is "json", "console" or "auto" (console on a terminal).
	// KILN_LOG_FORMAT. Default "auto".
	LogFormat string `yaml:"log_format"`
	// MetricsAddr, when set, is where `sched worker` serves Prometheus
	// metrics (host:port, e.g. ":9400"; port 0 picks a free one).
	// KILN_METRICS_ADDR. Default empty: off.
	MetricsAddr string `yaml:"metrics_addr"`
}

// Defaults for Config fields.
const (
	DefaultRedisURL      = "redis://127.0.0.1:6379/0"
	DefaultS3Bucket      = "kiln"
	DefaultDataDir       = ".kiln"
	DefaultTokenizer     = "mix-16384"
	DefaultShutdownGrace = 30 * time.Second
	DefaultLogFormat     = "auto"
)

// ShutdownGraceHint says what a shutdown grace may be, for the errors that
// refuse one of zero or less. Zero is how a Config says "not set", so a
// zero that was given would otherwise become the default unnoticed.
var ShutdownGraceHint = "give a duration such as 30s, or leave it unset for the default " + DefaultShutdownGrace.String()

// WithDefaults returns c with every unset field resolved to its default.
func (c Config) WithDefaults() Config {
	if c.RedisURL == "" {
		c.RedisURL = DefaultRedisURL
	}
	if c.S3Bucket == "" {
		c.S3Bucket = DefaultS3Bucket
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if len(c.LocalRoots) == 0 {
		c.LocalRoots = []string{c.DataDir}
	}
	if c.Tokenizer == "" {
		c.Tokenizer = DefaultTokenizer
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.LogFormat == "" {
		c.LogFormat = DefaultLogFormat
	}
	return c
}

// ConfigError is a configuration mistake; it names the setting's
// environment variable (and so its flag), and counts as bad input at the CLI.
type ConfigError struct {
	Env string // e.g. "KILN_REDIS_URL"
	Msg string
}

// Error names the setting as a user sets it: its environment variable and
// its flag (KILN_REDIS_URL, --redis-url), not the Go field.
func (e *ConfigError) Error() string {
	flag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(e.Env, "KILN_")), "_", "-")
	return fmt.Sprintf("%s (--%s): %s", e.Env, flag, e.Msg)
}

// BadInput marks configuration errors as the user's to fix.
func (e *ConfigError) BadInput() bool { return true }

// passwordHolds says whether raw's user information (before the last '@'
// of its authority) holds any of chars: '/', '?' or '#' end an authority
// early, and '%' begins an escape.
func passwordHolds(raw, chars string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	at := strings.LastIndex(rest, "@")
	return ok && at > 0 && strings.ContainsAny(rest[:at], chars)
}

// RedisOpt is the connection the Redis URL names, with its user name (an
// ACL user of Redis 6 and later), which asynq's parser drops: the password
// alone would be tried as the default user's.
func (c Config) RedisOpt() (asynq.RedisConnOpt, error) {
	opt, err := asynq.ParseRedisURI(c.RedisURL)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(c.RedisURL)
	if err != nil {
		return nil, err
	}
	if o, ok := opt.(asynq.RedisClientOpt); ok && u.User.Username() != "" {
		o.Username = u.User.Username()
		opt = o
	}
	return opt, nil
}

// Validate checks a defaulted Config; the first error names the field.
func (c Config) Validate() error {
	u, err := url.Parse(c.RedisURL)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		// url.Parse's own error quotes the URL whole, password included:
		// only the masked spelling is shown, and the reason in words.
		why := "it does not parse"
		if err == nil {
			why = "it needs the scheme redis:// or rediss:// and a host"
		}
		var escape url.EscapeError
		switch {
		case err != nil && strings.Contains(err.Error(), "invalid port"):
			why = "its port is not a number"
			if passwordHolds(c.RedisURL, "/?#") {
				why = "its password holds '/', '?' or '#', which end the host part: percent-encode them (%2F, %3F, %23)"
			}
		case errors.As(err, &escape) && passwordHolds(c.RedisURL, "%"):
			// Not shown: the escape is a piece of the password.
			why = "its password holds a '%' that begins no escape such as %2F: percent-encode each '%' of it as %25 (and '/', '?', '#' as %2F, %3F, %23)"
		}
		return &ConfigError{"KILN_REDIS_URL", fmt.Sprintf("%q is not a redis:// or rediss:// URL with a host (%s), e.g. %s", redact.URL(c.RedisURL), why, DefaultRedisURL)}
	}
	if port := u.Port(); port != "" && !validPort(port) {
		return &ConfigError{"KILN_REDIS_URL", fmt.Sprintf("port %s in %q is not a number from 1 to 65535, e.g. %s", port, redact.URL(c.RedisURL), DefaultRedisURL)}
	}
	if u.RawQuery != "" || u.Fragment != "" {
		// Read by no one: a password there would be sent nowhere, and an
		// option would seem to be in force. Named, not shown (a value
		// may be a password).
		var names []string
		for k := range u.Query() {
			names = append(names, k)
		}
		sort.Strings(names)
		what := "options after '?' (" + strings.Join(names, ", ") + ")"
		if u.RawQuery == "" {
			what = "a part after '#'"
		}
		return &ConfigError{"KILN_REDIS_URL", fmt.Sprintf("%q has %s, which kiln does not read: remove it; a password goes before the host, redis://[user]:password@host:port/db", redact.URL(u.Scheme+"://"+u.Host), what)}
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		var db int
		if _, err := fmt.Sscanf(p, "%d", &db); err != nil || db < 0 || fmt.Sprint(db) != p {
			return &ConfigError{"KILN_REDIS_URL", fmt.Sprintf("database %q in %q is not a number: end the URL with a database number such as /0, e.g. %s", p, redact.URL(c.RedisURL), DefaultRedisURL)}
		}
	}
	if c.S3Endpoint != "" {
		if strings.Contains(c.S3Endpoint, "@") {
			return &ConfigError{"KILN_S3_ENDPOINT", fmt.Sprintf("%q must be host:port: credentials go in KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY", redact.URL(c.S3Endpoint))}
		}
		if strings.Contains(c.S3Endpoint, "://") || strings.Contains(c.S3Endpoint, "/") {
			return &ConfigError{"KILN_S3_ENDPOINT", fmt.Sprintf("%q must be host:port without scheme or path (use KILN_S3_SECURE=true for https)", redact.URL(c.S3Endpoint))}
		}
		if why := endpointProblem(c.S3Endpoint); why != "" {
			return &ConfigError{"KILN_S3_ENDPOINT", fmt.Sprintf("%q is not host:port (%s), e.g. minio:9000 or 127.0.0.1:9000", redact.URL(c.S3Endpoint), why)}
		}
		switch {
		case c.S3AccessKey == "":
			return &ConfigError{"KILN_S3_ACCESS_KEY", "an S3 endpoint is set but its access key is empty"}
		case c.S3SecretKey == "":
			return &ConfigError{"KILN_S3_SECRET_KEY", "an S3 endpoint is set but its secret key is empty"}
		}
	}
	if !validBucket(c.S3Bucket) {
		return &ConfigError{"KILN_S3_BUCKET", fmt.Sprintf("%q is not a valid bucket name (3-63 characters: lower-case letters, digits, '-', '.')", c.S3Bucket)}
	}
	// The data directory is created when it does not exist; a file in its
	// place (or in the place of a directory above it) would fail only at
	// the first mkdir, naming a path and not the setting.
	if fi, err := os.Stat(c.DataDir); err == nil && !fi.IsDir() {
		return &ConfigError{"KILN_DATA_DIR", fmt.Sprintf("%q is a file, not a directory: point it at a directory (kiln creates one that does not exist)", c.DataDir)}
	} else if errors.Is(err, syscall.ENOTDIR) {
		return &ConfigError{"KILN_DATA_DIR", fmt.Sprintf("%q is under a file, not a directory: point it at a directory (kiln creates one that does not exist)", c.DataDir)}
	}
	for _, r := range c.LocalRoots {
		if strings.TrimSpace(r) == "" {
			return &ConfigError{"KILN_LOCAL_ROOTS", fmt.Sprintf("%q has an empty directory: list directories separated by %q", strings.Join(c.LocalRoots, string(os.PathListSeparator)), os.PathListSeparator)}
		}
	}
	if c.ShutdownGrace < 0 {
		return &ConfigError{"KILN_SHUTDOWN_GRACE", fmt.Sprintf("%v is negative: %s", c.ShutdownGrace, ShutdownGraceHint)}
	}
	switch c.LogFormat {
	case "json", "console", "auto":
	default:
		return &ConfigError{"KILN_LOG_FORMAT", fmt.Sprintf("%q is not one of json, console, auto", c.LogFormat)}
	}
	if c.MetricsAddr != "" {
		_, port, err := net.SplitHostPort(c.MetricsAddr)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			return &ConfigError{"KILN_METRICS_ADDR", fmt.Sprintf("%q is not host:port with a port from 0 to 65535, e.g. :9400 or 127.0.0.1:9400", c.MetricsAddr)}
		}
	}
	if err := store.CheckName("tokenizer", c.Tokenizer); err != nil {
		// The rule every name kiln is given keeps (a path is the usual
		// mistake: that is --tokenizer-file).
		return &ConfigError{"KILN_TOKENIZER", err.Error() + "; a file is --tokenizer-file"}
	}
	return nil
}

// endpointProblem says what is wrong with an S3 endpoint, host or
// host:port, or "" when nothing is: the host a name or an IP address
// (an IPv6 address in brackets), the port a number from 1 to 65535.
func endpointProblem(e string) string {
	if strings.ContainsFunc(e, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return "it has a space in it"
	}
	host := e
	if h, port, err := net.SplitHostPort(e); err == nil {
		if !validPort(port) {
			return fmt.Sprintf("port %q is not a number from 1 to 65535", port)
		}
		host = h
	} else if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
		host = e[1 : len(e)-1]
	} else if strings.Contains(e, ":") {
		return "it does not split into host and port; an IPv6 address goes in brackets, as in [::1]:9000"
	}
	if net.ParseIP(host) != nil {
		return ""
	}
	if host == "" {
		return "it has no host"
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		ok := label != "" && label[0] != '-' && label[len(label)-1] != '-'
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				ok = false
			}
		}
		if !ok {
			return fmt.Sprintf("host %q is not a host name or an IP address", host)
		}
	}
	return ""
}

// validPort reports whether port is a TCP port, 1 to 65535, written plainly.
func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == port
}

func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 {
		return false
	}
	for _, r := range b {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return b[0] != '-' && b[0] != '.'
}

// Masked returns a copy with secrets replaced, safe to print or log.
func (c Config) Masked() Config {
	c.S3SecretKey = mask(c.S3SecretKey)
	c.HFToken = mask(c.HFToken)
	c.RedisURL = redact.URL(c.RedisURL)
	c.S3Endpoint = redact.URL(c.S3Endpoint)
	return c
}

// Redact replaces in s every secret of c (the Redis password, however the
// URL is spelt, the S3 secret key, the hub token): for the text of an error
// from a library that may quote its input, before it is printed or logged.
func (c Config) Redact(s string) string {
	return redact.Secrets(s, append(redact.Password(c.RedisURL), append(redact.Password(c.S3Endpoint), c.S3SecretKey, c.HFToken)...)...)
}

func mask(s string) string {
	if s == "" {
		return ""
	}
	return "****"
}

// LocalStoreDir is where the local object store lives when no S3 endpoint is set.
func (c Config) LocalStoreDir() string { return filepath.Join(c.DataDir, "objects") }

// DefaultConfigPath is the config file read when --config is not given and
// the file exists: $XDG_CONFIG_HOME/kiln/config.yaml, or
// ~/.config/kiln/config.yaml where XDG_CONFIG_HOME is unset or relative
// (the XDG spec has a relative one ignored), on every system, as the help
// says.
func DefaultConfigPath() string {
	dir := os.Getenv("XDG_CONFIG_HOME")
	if !filepath.IsAbs(dir) {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "kiln", "config.yaml")
}
