// Package hub is kiln's client for the Hugging Face Hub's dataset endpoints:
// resolve a revision to a commit, list a repository's files through the tree
// API, and download files with resume and verification. It exists because a
// week-long ingest meets every failure the Hub has: broken connections,
// signed CDN redirects, gated repositories and rate limits (see
// docs/decisions/hub-client.md).
package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/bytesize"
	secret "github.com/kiln-lm/kiln/internal/redact"
)

// DefaultEndpoint is the Hub's base URL when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Config configures a Client. The zero value is usable: defaults are
// resolved in withDefaults, and Environment fills Endpoint and Token the
// way huggingface_hub does.
type Config struct {
	// Endpoint is the Hub's base URL (HF_ENDPOINT), without a trailing slash.
	Endpoint string
	// Token is sent as a bearer token to the Hub's own host only (HF_TOKEN).
	Token string
	// TokenFrom names what gave Token (HF_TOKEN where it is zero), for
	// the messages that say to change it.
	TokenFrom TokenSource
	// HTTPClient carries the requests; its CheckRedirect is replaced so that
	// the token never follows a redirect to another host.
	HTTPClient *http.Client
	// MaxConcurrent bounds the requests in flight, downloads included
	// (default 8): the Hub rate-limits per token, not per connection.
	MaxConcurrent int
	// MaxRetries bounds attempts after a transient failure (a broken
	// connection, a 5xx, a 429) for one request (default 8).
	MaxRetries int
	// MaxWait caps one wait for a rate limit or a backoff (default 5m).
	MaxWait time.Duration
	// StallTimeout abandons a request whose answer, or whose body, sends
	// nothing for this long (default 2m), and tries it again: a connection
	// left open with nothing on it (a stalled CDN node, a NAT that forgot
	// the connection while the peer still answers keep-alives) would
	// otherwise hold a download for good. A download resumes from the last
	// byte it had.
	StallTimeout time.Duration
	// MinRate and RateWindow abandon an answer whose body brings less
	// than MinRate bytes a second over a RateWindow (defaults 1 KiB/s and
	// 2m: under 120 KiB in 2 minutes), as a stall is: a server that
	// trickles a byte now and then never stalls, and would hold a
	// download, a page of a listing or a revision's answer for good. A
	// download resumes from its last byte, and one slower than that each
	// time gives up after MaxRetries more; any other answer is asked for
	// again, as a request that failed is.
	MinRate    int64
	RateWindow time.Duration
	// MaxEntries bounds the entries (files and folders) that one listing
	// reads (default 1,000,000): ten times the 100,000 files the Hub asks
	// a repository to keep under. A listing whose pages went on without
	// end (a mirror or proxy that links each page to a new one) held
	// every entry until the process was killed for it; a listed LFS file
	// holds about 250 bytes (500,000 decoded on a 2-vCPU VM), so the
	// bound keeps a listing near 250 MB, within the 1 GiB an ingest
	// worker stays under.
	MaxEntries int
	// Logger receives retries and rate-limit waits (default: none).
	Logger *zap.Logger
	// FailUnreached gives up at once on a Hub that is not reached at all
	// (no address for its name, no connection to it, directly or through
	// the proxy) before it has answered this client once, with an error
	// that names HF_ENDPOINT and is the user's to fix (BadInput): a person
	// at a terminal (sched datasets check, sched ingest --direct) is told
	// of a wrong HF_ENDPOINT or a network that is down at once, not after
	// a minute of retries that meet the same. Once the Hub has answered,
	// the same failure is a passing one and is retried as any other. A
	// worker leaves it off: its tasks wait out a Hub or a mirror that is
	// down or restarting, and are retried in turn.
	FailUnreached bool
}

// Environment returns a Config read from the environment as huggingface_hub
// reads it: HF_ENDPOINT (trailing slashes removed) and HF_TOKEN, with
// HUGGING_FACE_HUB_TOKEN as the older spelling, and which of the two gave
// the token.
func Environment() Config {
	var c Config
	c.Endpoint = strings.TrimRight(os.Getenv("HF_ENDPOINT"), "/")
	older := os.Getenv("HUGGING_FACE_HUB_TOKEN")
	switch c.Token = os.Getenv("HF_TOKEN"); {
	case c.Token != "" && older != "":
		// Two tokens: the one to change is the one read.
		c.TokenFrom = TokenSource{Name: "HF_TOKEN", Note: "read over HUGGING_FACE_HUB_TOKEN, also set"}
	case c.Token == "" && older != "":
		c.Token = older
		c.TokenFrom = TokenSource{Name: "HUGGING_FACE_HUB_TOKEN", Note: "HF_TOKEN's older name, read as HF_TOKEN is unset"}
	}
	return c
}

// TokenSource names what gave a Config's token, where a message says to
// change it: a user with a token of HUGGING_FACE_HUB_TOKEN, a flag or a
// config file, told to change HF_TOKEN, changes what is not read.
type TokenSource struct {
	// Name is the variable, the flag (--hf-token) or the config file's
	// key ("hf_token in /etc/kiln/config.yaml"): HF_TOKEN where empty.
	Name string
	// Note, where set, is said beside Name where a message first names
	// it: why it was read ("read over HUGGING_FACE_HUB_TOKEN, also
	// set"), or, where it gave no token, how ("given empty, so HF_TOKEN
	// is not read").
	Note string
}

// Setting is the source's name alone, for a remedy: "set HF_TOKEN to ...".
func (s TokenSource) Setting() string {
	if s.Name == "" {
		return "HF_TOKEN"
	}
	return s.Name
}

// said is the source as a message first names it, with its note.
func (s TokenSource) said() string {
	if s.Note == "" {
		return s.Setting()
	}
	return s.Setting() + " (" + s.Note + ")"
}

// unset says that the source gave no token: "HF_TOKEN is not set", or
// its note ("--hf-token is given empty, ...").
func (s TokenSource) unset() string {
	if s.Note == "" {
		return s.Setting() + " is not set"
	}
	return s.Setting() + " is " + s.Note
}

func (c Config) withDefaults() Config {
	if c.Endpoint == "" {
		c.Endpoint = DefaultEndpoint
	}
	c.Endpoint = strings.TrimRight(c.Endpoint, "/")
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: http.DefaultTransport}
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 8
	}
	if c.MaxRetries <= 0 {
		c.MaxRetries = 8
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 5 * time.Minute
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 2 * time.Minute
	}
	if c.MinRate <= 0 {
		c.MinRate = 1 << 10
	}
	if c.RateWindow <= 0 {
		c.RateWindow = 2 * time.Minute
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 1_000_000
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &BadInputError{fmt.Errorf("hub endpoint %q (HF_ENDPOINT) is not an http(s) URL: set it to a base URL such as %s", secret.URL(c.Endpoint), DefaultEndpoint)}
	}
	return nil
}

// Client talks to one Hub endpoint. It is safe for concurrent use.
type Client struct {
	cfg  Config
	host string // the endpoint's host:port, the only host that sees the token
	http *http.Client
	sem  chan struct{}
	// defaulted: Config.Endpoint was empty (HF_ENDPOINT unset), so that
	// errors about the endpoint say where its value came from.
	defaulted bool
	// reached: some request of this client was answered over HTTP, with
	// any status: the endpoint's host is there (Config.FailUnreached).
	reached atomic.Bool
	// served: the endpoint answered as the Hub does, with a 2xx or with
	// one of the Hub's error codes (X-Error-Code): a later 404 without
	// one is a missing path of a mirror that sends none, not a wrong
	// HF_ENDPOINT (statusError).
	served atomic.Bool
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	defaulted := strings.TrimRight(cfg.Endpoint, "/") == ""
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	u, _ := url.Parse(cfg.Endpoint)
	c := &Client{cfg: cfg, host: u.Host, sem: make(chan struct{}, cfg.MaxConcurrent), defaulted: defaulted}
	hc := *cfg.HTTPClient
	hc.Transport = pinged(hc.Transport, cfg.StallTimeout)
	hc.CheckRedirect = c.checkRedirect
	c.http = &hc
	return c, nil
}

// pinged is rt with HTTP/2's health check on, where rt is an
// *http.Transport: a connection that receives nothing for half the stall
// timeout is pinged, and closed if the ping is not answered within the
// other half. A stall only resets its own stream, and an HTTP/2 connection
// that carries nothing any more (a NAT or proxy that dropped it) would
// otherwise be taken again by every retry, each stalling in turn.
func pinged(rt http.RoundTripper, stall time.Duration) http.RoundTripper {
	t, ok := rt.(*http.Transport)
	if !ok {
		return rt
	}
	t = t.Clone()
	var h2 http.HTTP2Config
	if t.HTTP2 != nil {
		h2 = *t.HTTP2
	}
	h2.SendPingTimeout, h2.PingTimeout = stall/2, stall/2
	t.HTTP2 = &h2
	return t
}

// Endpoint returns the base URL the client talks to.
func (c *Client) Endpoint() string { return c.cfg.Endpoint }

// endpointSetting is the endpoint as errors about it name it, its value
// and the variable that gave it or that it is the default, and what to set
// that variable to.
func (c *Client) endpointSetting() (named, fix string) {
	if c.defaulted {
		return secret.URL(c.cfg.Endpoint) + " (HF_ENDPOINT is unset)", "set HF_ENDPOINT to a mirror of the Hub"
	}
	return "HF_ENDPOINT " + secret.URL(c.cfg.Endpoint), "set HF_ENDPOINT to the Hub's address or a mirror's (unset, it is " + DefaultEndpoint + ")"
}

// DatasetPage is the dataset's page on the Hub, where gated terms are accepted.
func (c *Client) DatasetPage(repo string) string {
	// Shown to people in errors: never with a password from HF_ENDPOINT.
	return secret.URL(c.cfg.Endpoint + "/datasets/" + repo)
}

// checkRedirect drops the token on any hop that leaves the Hub's host:port.
// net/http alone would forward it to another port of the same host, and a
// CDN's signed URL needs no token.
func (c *Client) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return fmt.Errorf("stopped after %d redirects", len(via))
	}
	if req.URL.Host != c.host {
		req.Header.Del("Authorization")
	}
	return nil
}

// acquire takes a concurrency slot; release gives it back.
func (c *Client) acquire(ctx context.Context) error {
	select {
	case c.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Client) release() { <-c.sem }

// newRequest builds a GET for the Hub, with the token when there is one.
func (c *Client) newRequest(ctx context.Context, rawURL string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "kiln-ingest")
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	return req, nil
}

// get performs GET rawURL with retries on transient failures and returns a
// response with a 2xx status. The caller closes the body. edit may add
// headers (Range) before each attempt. The caller holds a concurrency slot.
func (c *Client) get(ctx context.Context, repo, rawURL string, edit func(*http.Request)) (*http.Response, error) {
	return c.getRead(ctx, repo, rawURL, edit, nil)
}

// getRead is get that, where read is not nil, has read take the body of
// each 2xx answer within its attempt, under the floor (MinRate) a
// download's body is under: an answer whose body stalls, trickles or
// breaks before read is done is asked for again, as a request that failed
// is, where one whose body was left to its caller would hold it for as
// long as the server keeps the connection open. Read's other errors (what
// the body holds, not how it came) are returned as they are. The response
// returned after read has its body closed, and its headers.
func (c *Client) getRead(ctx context.Context, repo, rawURL string, edit func(*http.Request), read func(*http.Response) error) (*http.Response, error) {
	var lastErr error
	// unreached: the host the last attempt reached no server of (no
	// address for the name, or no connection): the Hub's, or a download's
	// CDN it was sent on to; "" where it reached one.
	unreached := ""
	// stalled: the host whose answer to the last attempt stalled or
	// trickled; "" where it did not.
	stalled := ""
	for attempt := 0; ; attempt++ {
		watch := c.watch(ctx)
		req, err := c.newRequest(watch.ctx, rawURL)
		if err != nil {
			watch.stop()
			return nil, err
		}
		if edit != nil {
			edit(req)
		}
		resp, err := c.http.Do(req)
		var wait time.Duration
		stalled = ""
		switch {
		case err != nil:
			watch.stop()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = watch.explain(err)
			if watch.stalled() {
				stalled = errHost(err, c.host)
			}
			unreached = notReached(err, c.host)
			if unreached == c.host && c.cfg.FailUnreached && !c.reached.Load() {
				// Never answered: a wrong address, or no network, which
				// retries would only meet again.
				named, fix := c.endpointSetting()
				return nil, &BadInputError{fmt.Errorf("%w: the Hub at %s is not reached from here; check this machine's network and proxy, or %s",
					lastErr, named, fix)}
			}
			wait = backoff(attempt)
		case resp.StatusCode >= 200 && resp.StatusCode < 300:
			c.reached.Store(true)
			c.served.Store(true)
			body := &watchedBody{ReadCloser: resp.Body, w: watch}
			resp.Body = body
			if read == nil {
				if attempt > 0 {
					notice(ctx, "") // answered: the wait's notice is over
				}
				return resp, nil
			}
			body.minRate(c.cfg.MinRate, c.cfg.RateWindow, "an answer")
			err := read(resp)
			resp.Body.Close()
			switch {
			case err != nil && ctx.Err() != nil:
				return nil, ctx.Err()
			case body.failed != nil:
				// The connection, not what it brought: read may have
				// taken a break for the body's end (io.ReadFull).
				unreached, lastErr = "", body.failed
				var slow *slowError
				if watch.stalled() || errors.As(body.failed, &slow) {
					stalled = resp.Request.URL.Host
				}
				wait = backoff(attempt)
			case err != nil:
				return nil, err
			default:
				if attempt > 0 {
					notice(ctx, "")
				}
				return resp, nil
			}
		case resp.StatusCode == http.StatusTooManyRequests:
			c.reached.Store(true)
			unreached = ""
			wait = rateLimitWait(resp.Header, attempt)
			lastErr = fmt.Errorf("rate limited (429) by %s", resp.Request.URL.Host)
			drain(resp)
		case resp.StatusCode >= 500:
			c.reached.Store(true)
			unreached = ""
			lastErr = fmt.Errorf("%s answered %s", resp.Request.URL.Host, resp.Status)
			wait = backoff(attempt)
			if resp.Header.Get("Retry-After") != "" {
				// A server in maintenance says when it is back.
				wait = rateLimitWait(resp.Header, attempt)
			}
			drain(resp)
		default:
			c.reached.Store(true)
			err := c.statusError(repo, rawURL, resp)
			drain(resp)
			watch.stop()
			return nil, err
		}
		watch.stop()
		if attempt >= c.cfg.MaxRetries {
			// The cause first: a listing cuts a reason to one short line,
			// and a file's URL is long.
			switch {
			case unreached == c.host:
				return nil, fmt.Errorf("%w (given up after %d attempts at GET %s): %s is not reached from here; check this machine's network and proxy, or set HF_ENDPOINT to a mirror of the Hub",
					lastErr, attempt+1, redact(rawURL), unreached)
			case unreached != "":
				return nil, fmt.Errorf("%w (given up after %d attempts at GET %s): the Hub sent the download on to %s, which is not reached from here; check that this machine's network and proxy let it through",
					lastErr, attempt+1, redact(rawURL), unreached)
			case stalled == c.host:
				named, fix := c.endpointSetting()
				return nil, fmt.Errorf("%w (given up after %d attempts at GET %s): the Hub at %s sent nothing, or too little, each time; check this machine's network and proxy (one that holds connections open without passing them on), or %s",
					lastErr, attempt+1, redact(rawURL), named, fix)
			case stalled != "":
				return nil, fmt.Errorf("%w (given up after %d attempts at GET %s): %s, where the Hub sent the request on, sent nothing, or too little, each time; check that this machine's network and proxy let it through",
					lastErr, attempt+1, redact(rawURL), stalled)
			}
			return nil, fmt.Errorf("%w (given up after %d attempts at GET %s)", lastErr, attempt+1, redact(rawURL))
		}
		wait = min(wait, c.cfg.MaxWait)
		c.cfg.Logger.Info("hub request will be retried", zap.String("url", redact(rawURL)),
			zap.Int("attempt", attempt+1), zap.Duration("wait", wait), zap.Error(lastErr))
		notice(ctx, fmt.Sprintf("%v; trying again in %v (attempt %d of %d)", lastErr, wait.Round(time.Second/10), attempt+2, c.cfg.MaxRetries+1))
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// notReached is the host err says no server of was reached (the name has
// no address, the connection or the proxy's was refused or timed out):
// the one its request went to, else host; "" where err says something
// else.
func notReached(err error, host string) string {
	var dns *net.DNSError
	var op *net.OpError
	if !errors.As(err, &dns) && !(errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect")) {
		return ""
	}
	return errHost(err, host)
}

// errHost is the host of the request that err, from a Client's Do, failed
// at (the Hub's, or one it redirected to), else host.
func errHost(err error, host string) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil && u.Host != "" {
			return u.Host
		}
	}
	return host
}

// getJSON decodes a JSON answer into v and returns the response headers.
func (c *Client) getJSON(ctx context.Context, repo, rawURL string, v any) (http.Header, error) {
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	resp, err := c.getRead(ctx, repo, rawURL, nil, func(resp *http.Response) error {
		// What an attempt cut short decoded is not kept.
		reflect.ValueOf(v).Elem().SetZero()
		if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(v); err != nil {
			return fmt.Errorf("GET %s: decoding the answer: %w", redact(rawURL), err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp.Header, nil
}

// statusError turns a final non-2xx answer into an error that says what to do.
func (c *Client) statusError(repo, rawURL string, resp *http.Response) error {
	code := resp.Header.Get("X-Error-Code")
	msg := resp.Header.Get("X-Error-Message")
	if msg == "" {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		} else {
			msg = strings.TrimSpace(string(body))
		}
	}
	// A proxy or mirror may echo the request, its Authorization header
	// included: the token never reaches an error, which is logged, shown
	// by sched status and kept in Redis.
	msg = secret.Secrets(msg, c.cfg.Token)
	if code != "" {
		c.served.Store(true)
	}
	switch {
	case code == "GatedRepo" || (resp.StatusCode == http.StatusForbidden && strings.Contains(msg, "authorized list")):
		return &GatedError{Repo: repo, Page: c.DatasetPage(repo), HasToken: c.cfg.Token != "", TokenFrom: c.cfg.TokenFrom}
	case (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) && resp.Request.URL.Host == c.host:
		// Only the Hub's own host: a CDN's 403 is to a signed URL that
		// expired on its way, and a download tried again resolves a
		// fresh one.
		return &AccessError{Repo: repo, Page: c.DatasetPage(repo), Tokens: secret.URL(c.cfg.Endpoint) + "/settings/tokens",
			Status: resp.StatusCode, Message: oneLine(msg), HasToken: c.cfg.Token != "", TokenFrom: c.cfg.TokenFrom, NotFound: code == "RepoNotFound"}
	case code == "RepoNotFound":
		return &RepoNotFoundError{Repo: repo, Endpoint: secret.URL(c.cfg.Endpoint), Page: c.DatasetPage(repo), Status: resp.StatusCode,
			HasToken: c.cfg.Token != "", TokenFrom: c.cfg.TokenFrom}
	case code == "RevisionNotFound":
		return &RevisionNotFoundError{Repo: repo, URL: redact(rawURL)}
	case resp.StatusCode == http.StatusNotFound && code == "" && !c.served.Load() && strings.HasPrefix(rawURL, c.cfg.Endpoint+"/api/"):
		// The Hub's API names what it does not find (RepoNotFound,
		// RevisionNotFound, EntryNotFound); a 404 without a name, before
		// the endpoint has answered as the Hub, is a server with no such
		// API under that address: an HF_ENDPOINT with a path too many
		// (.../api), or another site's. The dataset is not at fault.
		said := fmt.Sprintf("%s answered 404 to GET %s, a request of the Hub's API, without the Hub's error code (X-Error-Code) that would name what is missing", resp.Request.URL.Host, redact(rawURL))
		if c.defaulted {
			return &BadInputError{fmt.Errorf("%s: with HF_ENDPOINT unset, something between here and the Hub answers in its stead; check this machine's proxy, or set HF_ENDPOINT to a mirror of the Hub", said)}
		}
		return &BadInputError{fmt.Errorf("%s: HF_ENDPOINT %s may not be the Hub's address or a mirror's; set it to the base URL under which the Hub's API answers /api/datasets/ (%s for the Hub itself)",
			said, secret.URL(c.cfg.Endpoint), DefaultEndpoint)}
	case resp.StatusCode == http.StatusNotFound:
		return &NotFoundError{URL: redact(rawURL), Repo: repo}
	}
	if msg != "" {
		return fmt.Errorf("GET %s: %s: %s", redact(rawURL), resp.Status, msg)
	}
	return fmt.Errorf("GET %s: %s", redact(rawURL), resp.Status)
}

// GatedError says that a dataset's terms must be accepted on its page.
type GatedError struct {
	Repo     string
	Page     string
	HasToken bool
	// TokenFrom names what gave the token, or gave none.
	TokenFrom TokenSource
}

func (e *GatedError) Error() string {
	if e.HasToken {
		return fmt.Sprintf("dataset %s is gated and this %s is not in its authorized list: accept its terms at %s with the token's account", e.Repo, e.TokenFrom.said(), e.Page)
	}
	if e.TokenFrom.Note != "" {
		// --hf-token given empty: a variable also set is not read.
		return fmt.Sprintf("dataset %s is gated and %s: accept its terms at %s and set %s", e.Repo, e.TokenFrom.unset(), e.Page, e.TokenFrom.Setting())
	}
	return fmt.Sprintf("dataset %s is gated: accept its terms at %s and set %s", e.Repo, e.Page, e.TokenFrom.Setting())
}

// BadInput marks the error as the user's to fix.
func (e *GatedError) BadInput() bool { return true }

// AccessError says that the Hub's own host refused a dataset's request
// (401 or 403) for a reason other than its gate: HF_TOKEN is invalid or
// expired, a fine-grained HF_TOKEN lacks the permission to read it, or no
// HF_TOKEN is set for a private dataset. Every file of the dataset meets
// the same refusal until HF_TOKEN changes, so it is not retried.
type AccessError struct {
	Repo   string
	Page   string // the dataset's page
	Tokens string // the Hub's page of access tokens
	Status int    // 401 or 403
	// Message is the Hub's own words, on one line ("" where it gave none).
	Message  string
	HasToken bool
	// TokenFrom names what gave the token, or gave none.
	TokenFrom TokenSource
	// NotFound is the Hub's RepoNotFound: to a request without a token it
	// does not tell a missing dataset from a private one.
	NotFound bool
}

func (e *AccessError) Error() string {
	said := strconv.Itoa(e.Status)
	if e.Message != "" {
		said += ": " + e.Message
	}
	from, set := e.TokenFrom.said(), e.TokenFrom.Setting()
	switch {
	case e.Status == http.StatusUnauthorized && e.HasToken:
		return fmt.Sprintf("the Hub refused %s for dataset %s (%s): the token is invalid or expired; set %s to a token from %s of an account that may read %s",
			from, e.Repo, said, set, e.Tokens, e.Page)
	case e.NotFound && !e.HasToken:
		return fmt.Sprintf("dataset %s was not found on the Hub (%s) and %s: check its name at %s; if it is private, set %s of an account that may read it",
			e.Repo, said, e.TokenFrom.unset(), e.Page, set)
	case !e.HasToken:
		return fmt.Sprintf("dataset %s needs a token (%s) and %s: set %s to a token from %s of an account that may read it, and accept its terms at %s if it is gated",
			e.Repo, said, e.TokenFrom.unset(), set, e.Tokens, e.Page)
	}
	return fmt.Sprintf("the Hub refused %s for dataset %s (%s): if it is a fine-grained token, give it \"Read access to contents of all public gated repos you can access\" for a gated dataset, or read access to this one, at %s; else set %s to a token of an account that may read %s",
		from, e.Repo, said, e.Tokens, set, e.Page)
}

// BadInput marks the error as the user's to fix.
func (e *AccessError) BadInput() bool { return true }

// oneLine is the Hub's message for an error of one line: its whitespace
// folded, and cut where a proxy's page in its stead would run on.
func oneLine(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if r := []rune(msg); len(r) > 200 {
		msg = string(r[:200]) + "…"
	}
	return msg
}

// RepoNotFoundError says that the Hub has no dataset repo that this
// request may read (404 RepoNotFound, to a request with a token): none of
// that name, or a private one. Every file of the dataset meets it alike
// until the user changes the name or HF_TOKEN, so it is not retried.
type RepoNotFoundError struct {
	Repo     string
	Endpoint string
	Page     string // the dataset's page
	Status   int    // the answer's: 404 from the Hub itself
	HasToken bool
	// TokenFrom names what gave the token, or gave none.
	TokenFrom TokenSource
	// Commit, where set, is the commit of the dataset that the download
	// was planned at: the dataset was there then, and was deleted, renamed
	// or made private since.
	Commit string
}

func (e *RepoNotFoundError) Error() string {
	if e.Commit == "" {
		return fmt.Sprintf("dataset %s was not found on %s: check its name at %s", e.Repo, e.Endpoint, e.Page)
	}
	token := "that " + e.TokenFrom.said() + " holds a token of an account that may read it"
	if !e.HasToken {
		token = "set " + e.TokenFrom.Setting() + " to a token of an account that may read it"
	}
	return fmt.Sprintf("dataset %s is no longer found on %s (%d RepoNotFound), where commit %s was planned: it was deleted, renamed or made private since; check its name at %s and, if it is private, %s; then run the ingest again (sched enqueue ingest, or sched ingest --direct) to plan it under its name",
		e.Repo, e.Endpoint, e.Status, e.Commit, e.Page, token)
}

// BadInput marks the error as the user's to fix.
func (e *RepoNotFoundError) BadInput() bool { return true }

// RevisionNotFoundError says that the hub has no such revision of a
// dataset (RevisionNotFound). Every file of the dataset meets it alike at
// that revision, so it is not retried.
type RevisionNotFoundError struct {
	Repo string
	URL  string
	// Commit, where set, is the commit that a download was planned at:
	// the dataset had it then, and a force-push replaced it since.
	Commit string
}

func (e *RevisionNotFoundError) Error() string {
	if e.Commit == "" {
		return fmt.Sprintf("dataset %s has no such revision (%s): check the revision in the preset", e.Repo, e.URL)
	}
	return fmt.Sprintf("commit %s of dataset %s, which the ingest was planned at, is gone from the hub (RevisionNotFound: a force-push replaced it): run the ingest again (sched enqueue ingest, or sched ingest --direct) to plan it at the current commit; the files its store holds are left out",
		e.Commit, e.Repo)
}

// BadInput marks the error as the user's to fix.
func (e *RevisionNotFoundError) BadInput() bool { return true }

// NotFoundError is a 404 for a file or path that does not exist.
type NotFoundError struct {
	URL  string
	Repo string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("%s: not found in dataset %s (404)", e.URL, e.Repo)
}

// BadInputError wraps an error the user fixes (a name, a token, an endpoint).
type BadInputError struct{ Err error }

func (e *BadInputError) Error() string  { return e.Err.Error() }
func (e *BadInputError) Unwrap() error  { return e.Err }
func (e *BadInputError) BadInput() bool { return true }

// IsGated reports whether err says a dataset is gated.
func IsGated(err error) bool {
	var g *GatedError
	return errors.As(err, &g)
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

// stallWatch cancels one attempt's request when nothing arrives for
// StallTimeout: before its answer's headers, or between two reads of its body.
type stallWatch struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	d      time.Duration
}

// errStalled is the cause of a request that the watch cancelled.
var errStalled = errors.New("stalled")

func (c *Client) watch(ctx context.Context) *stallWatch {
	w := &stallWatch{d: c.cfg.StallTimeout}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.timer = time.AfterFunc(w.d, func() { w.cancel(errStalled) })
	return w
}

// stalled says whether the watch cancelled its request.
func (w *stallWatch) stalled() bool { return errors.Is(context.Cause(w.ctx), errStalled) }

func (w *stallWatch) stop() {
	w.timer.Stop()
	w.cancel(nil)
}

// explain names a stall as such: the transport reports only a cancellation.
func (w *stallWatch) explain(err error) error {
	if w.stalled() {
		return fmt.Errorf("nothing arrived for %v (the connection stalled)", w.d)
	}
	return err
}

// watchedBody restarts its watch's timer whenever bytes arrive, and,
// with a floor (minRate), fails a read once a window of its reads has
// brought less than the floor.
type watchedBody struct {
	io.ReadCloser
	w *stallWatch
	// failed is the first read that failed other than at the body's end:
	// the connection's fault (a stall, a trickle, a break), not the
	// body's.
	failed error

	rate   int64         // the floor, in bytes a second; 0: none
	window time.Duration // over which the rate is measured
	since  time.Time     // when the window began
	moved  int64         // bytes read since then
	what   string        // what the floor is of, for its error: "a download"
}

// minRate sets the body's floor from now on: rate bytes a second, over
// each window. A trickle slower than one read per StallTimeout is the
// stall watch's; any other is caught at the first read past the window.
func (b *watchedBody) minRate(rate int64, window time.Duration, what string) {
	b.rate, b.window, b.since, b.moved, b.what = rate, window, time.Now(), 0, what
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.read(p)
	if err != nil && err != io.EOF && b.failed == nil {
		b.failed = err
	}
	return n, err
}

func (b *watchedBody) read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.w.timer.Reset(b.w.d)
	}
	if err != nil && err != io.EOF {
		err = b.w.explain(err)
	}
	if b.rate > 0 && err == nil {
		b.moved += int64(n)
		if took := time.Since(b.since); took >= b.window {
			if float64(b.moved) < float64(b.rate)*took.Seconds() {
				return n, &slowError{moved: b.moved, took: took, rate: b.rate, what: b.what}
			}
			b.since, b.moved = time.Now(), 0
		}
	}
	return n, err
}

// slowError is a body that brought less than its floor over a window.
type slowError struct {
	moved int64
	took  time.Duration
	rate  int64  // the floor, bytes a second
	what  string // what the floor is of: "a download", "an answer"
}

func (e *slowError) Error() string {
	return fmt.Sprintf("%s arrived in %v (%s/s), under the %s/s %s must keep up (the connection stalled)",
		bytesize.Format(e.moved), e.took.Round(time.Millisecond), bytesize.Format(int64(float64(e.moved)/e.took.Seconds())), bytesize.Format(e.rate), e.what)
}

func (b *watchedBody) Close() error {
	b.w.stop()
	return b.ReadCloser.Close()
}

type noticeKey struct{}

// WithRetryNotice returns ctx under which the client tells say why a
// request waits to be tried again (a 503, a rate limit, a broken
// connection) as it starts to wait: a task shows that, not a download
// that seems to hang. Once a request tried again is answered, say hears
// "": the task goes back to saying what it does.
func WithRetryNotice(ctx context.Context, say func(msg string)) context.Context {
	return context.WithValue(ctx, noticeKey{}, say)
}

// SayRetries is WithRetryNotice for a task whose message is msg: say
// hears msg with the notice after it while a request waits to be tried
// again, and msg alone once it is answered.
func SayRetries(ctx context.Context, msg string, say func(msg string)) context.Context {
	return WithRetryNotice(ctx, func(note string) {
		if note == "" {
			say(msg)
			return
		}
		say(msg + ": " + note)
	})
}

func notice(ctx context.Context, msg string) {
	if say, ok := ctx.Value(noticeKey{}).(func(string)); ok && say != nil {
		say(msg)
	}
}

// backoff is exponential with full jitter, from 250ms, capped at 30s.
func backoff(attempt int) time.Duration {
	d := 250 * time.Millisecond << min(attempt, 7)
	d = min(d, 30*time.Second)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// redact drops the query of a URL: signed CDN URLs carry credentials there;
func redact(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		raw = raw[:i]
	}
	// and an endpoint written with a password (HF_ENDPOINT=https://u:p@host).
	return secret.URL(raw)
}

// escapePath escapes each segment of a repository path for a URL.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}
