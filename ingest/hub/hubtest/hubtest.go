// Package hubtest runs a local Hugging Face Hub for tests: an HTTP server
// that speaks the endpoints kiln uses (revision, tree with Link pagination,
// resolve with a redirect to a separate CDN host that honours Range), and
// that can answer as a gated repository, refuse a token as the Hub does
// (a fine-grained one without the permission to read gated datasets, one
// revoked), lose a dataset or a file after it was listed, rate-limit with
// 429, break a download's connection half way, send a body longer than
// its file or trickle it (SetBody), list pages without end
// (MorePages), and answer its API late, slowly or never (SetAnswer).
package hubtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Hub is a fake Hub with one CDN. Set its fields before the first request
// and before Add, whose lock orders them before the server's reads: a
// request from a process the test starts orders nothing for the race
// detector. Once it may be serving, change it with its setters:
// SetBeforeResolve, Authorize, Revoke, SetUnavailable, SetRateLimited,
// SetIgnoreRange, SetBody, SetAnswer.
type Hub struct {
	// Server is the Hub; CDN is where resolve redirects LFS files.
	Server *httptest.Server
	CDN    *httptest.Server

	// Commit is what every revision resolves to.
	Commit string
	// PageSize is the number of tree entries per page (default 2).
	PageSize int
	// Gated makes every dataset gated: a request without a token gets 401
	// GatedRepo, one with a token outside Authorized gets 403.
	Gated      bool
	Authorized string
	// FineGrained is a fine-grained token without the permission to read
	// gated datasets ("Read access to contents of all public gated repos
	// you can access"): with Gated, the Hub refuses it 403 with no
	// GatedRepo code, its account authorized or not.
	FineGrained string
	// Revoked is a token the Hub no longer knows (expired, or deleted by
	// its owner): every request that carries it is refused 401, a public
	// dataset's too. Revoke sets it mid-test.
	Revoked string
	// PublicListing, with Gated, answers the revision and tree endpoints
	// without a token, as the Hub does for a gated dataset: its files are
	// listed for all, and only their downloads are gated.
	PublicListing bool
	// LoopPages links the tree listing's last page back to its first, as
	// a broken proxy or cache could, where it would end the listing.
	LoopPages bool
	// MorePages goes on with the tree listing past its last page, for
	// this many pages (-1: without end) of PageSize made-up files
	// (more/000000000.parquet, ...), each page linking to a new cursor,
	// as a broken or hostile mirror could.
	MorePages int
	// RateLimited answers this many requests with 429 before serving.
	RateLimited int
	// Unavailable answers this many requests with 503 and a Retry-After
	// of RetryAfter seconds before serving, as the Hub does in maintenance.
	Unavailable int
	RetryAfter  int
	// BreakOnce cuts the first CDN download of each file after half its bytes.
	BreakOnce bool
	// EndEarlyOnce ends the first CDN download of each file after half its
	// bytes as if that were all: no Content-Length, and the connection
	// closed (a proxy that drops the length, then the connection).
	EndEarlyOnce bool
	// StallOnce sends half of the first CDN download of each file, then
	// nothing more on a connection it keeps open (as a stalled CDN node
	// does) until the client gives up on it or the Hub is closed.
	StallOnce bool
	// CutAfter cuts every CDN answer's connection after this many bytes of
	// its body (0: never), as a proxy that caps one connection's transfer
	// does.
	CutAfter int
	// CDNForbidden answers this many CDN requests with 403 AccessDenied,
	// as S3 answers a signed URL that expired before it was asked.
	CDNForbidden int
	// IgnoreRange makes the CDN answer every request with the whole file.
	IgnoreRange bool

	mu       sync.Mutex
	files    map[string]map[string][]byte // repo -> path -> content
	lfs      map[string]bool              // repo/path -> stored in LFS
	broken   map[string]bool
	stalled  map[string]bool
	ended    map[string]bool
	bodies   map[string]Body    // repo/path -> how its downloads are sent
	answers  map[string]*Answer // API verb -> how its answers are sent
	requests []Request
	closing  chan struct{}
	closed   sync.Once
	// beforeResolve is SetBeforeResolve's hook, read and written under mu.
	beforeResolve func(ctx context.Context, repo, path string) error
}

// Request is one request seen by the Hub or the CDN.
type Request struct {
	Host          string // "hub" or "cdn"
	Path          string
	Authorization string
	Range         string
	Query         string // the URL's, without the "?"
	Status        int    // 0: not answered (Answer.Silent)
}

// New starts a Hub and its CDN; Close them with Close.
func New() *Hub {
	h := &Hub{
		Commit:   strings.Repeat("c0ffee", 6) + "c0ff",
		PageSize: 2,
		files:    map[string]map[string][]byte{},
		lfs:      map[string]bool{},
		broken:   map[string]bool{},
		stalled:  map[string]bool{},
		ended:    map[string]bool{},
		bodies:   map[string]Body{},
		answers:  map[string]*Answer{},
		closing:  make(chan struct{}),
	}
	h.Server = httptest.NewServer(http.HandlerFunc(h.serveHub))
	// The CDN is reached by a different host name than the Hub (localhost
	// versus 127.0.0.1), as a real CDN would be.
	h.CDN = httptest.NewServer(http.HandlerFunc(h.serveCDN))
	h.CDN.URL = strings.Replace(h.CDN.URL, "127.0.0.1", "localhost", 1)
	return h
}

// Close stops both servers.
func (h *Hub) Close() {
	h.closed.Do(func() { close(h.closing) })
	h.Server.Close()
	h.CDN.Close()
}

// Add stores a file in repo; lfs says whether it is served through the CDN.
func (h *Hub) Add(repo, path string, content []byte, lfs bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.files[repo] == nil {
		h.files[repo] = map[string][]byte{}
	}
	h.files[repo][path] = content
	h.lfs[repo+"/"+path] = lfs
}

// Delete removes repo, its listing and its files, from the next request
// on, as its owner deleting it, renaming it or making it private does to
// a reader it does not let in: the Hub answers RepoNotFound, 404 to a
// request with a token and 401 to one without.
func (h *Hub) Delete(repo string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.files, repo)
}

// DeleteFile removes path from repo from the next request on, as a commit
// that deletes it does: its download is answered 404 EntryNotFound.
func (h *Hub) DeleteFile(repo, path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// A copy: a request in flight reads the map it was given unlocked.
	files := maps.Clone(h.files[repo])
	delete(files, path)
	h.files[repo] = files
}

// ForcePush moves every branch to a new commit and forgets the old one, as
// a force-push does once the Hub has let go of the commit it replaced: a
// request at the old commit is answered 404 RevisionNotFound. It returns
// the new commit.
func (h *Hub) ForcePush() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	sum := sha1.Sum([]byte(h.Commit))
	h.Commit = hex.EncodeToString(sum[:])
	return h.Commit
}

// Authorize grants token access to the gated datasets from the next
// request on, as accepting a dataset's terms on the Hub does.
func (h *Hub) Authorize(token string) {
	h.mu.Lock()
	h.Authorized = token
	h.mu.Unlock()
}

// Revoke makes the Hub refuse token from the next request on, as it does
// once the token expired or its owner deleted it.
func (h *Hub) Revoke(token string) {
	h.mu.Lock()
	h.Revoked = token
	h.mu.Unlock()
}

// SetUnavailable makes the Hub answer the next n requests with 503 and a
// Retry-After of retryAfter seconds, from the next request on: a Hub that
// goes into maintenance, or (n 0) comes back, while it is being used.
func (h *Hub) SetUnavailable(n, retryAfter int) {
	h.mu.Lock()
	h.Unavailable, h.RetryAfter = n, retryAfter
	h.mu.Unlock()
}

// SetRateLimited makes the Hub answer the next n requests with 429, from
// the next request on.
func (h *Hub) SetRateLimited(n int) {
	h.mu.Lock()
	h.RateLimited = n
	h.mu.Unlock()
}

// SetIgnoreRange makes the CDN answer every request with the whole file
// (ignore) or honour Range again, from the next request on.
func (h *Hub) SetIgnoreRange(ignore bool) {
	h.mu.Lock()
	h.IgnoreRange = ignore
	h.mu.Unlock()
}

// SetBeforeResolve sets the hook that runs before the Hub answers a
// request to download a file of repo (a resolve), which waits for it, from
// the next request on; nil takes it out. An error it returns answers the
// request with 503 and the error's text. A test acts there at a given
// download, or holds it until what it tests has happened. What the test
// wrote before the call, the hook sees.
func (h *Hub) SetBeforeResolve(f func(ctx context.Context, repo, path string) error) {
	h.mu.Lock()
	h.beforeResolve = f
	h.mu.Unlock()
}

// Body is how the downloads of one file are sent, where not at once
// and as listed (SetBody).
type Body struct {
	// Extra bytes follow the file's content, which the listing still
	// gives the size and ids of (-1: without end, until the client goes
	// or the Hub is closed), as a broken or hostile server sends them.
	Extra int64
	// Length sends a Content-Length that counts Extra, where it has an
	// end; else the body has no length (chunked).
	Length bool
	// Every is a pause before each byte: a body that trickles.
	Every time.Duration
}

// SetBody makes every download of path in repo, through the CDN or the
// Hub itself, be sent as b, from the next request on. Range is honoured.
func (h *Hub) SetBody(repo, path string, b Body) {
	h.mu.Lock()
	h.bodies[repo+"/"+path] = b
	h.mu.Unlock()
}

// Answer is how the Hub sends the answers of one endpoint of its API,
// where not at once (SetAnswer): as a server, a mirror or a proxy between
// that hangs or crawls does.
type Answer struct {
	// Silent takes the request and sends nothing, not even a status,
	// until the client goes or the Hub is closed.
	Silent bool
	// Mute sends the status and headers at once, then none of the body.
	Mute bool
	// Every is a pause before each byte of the body, which follows the
	// status and headers, sent at once: an answer that trickles.
	Every time.Duration
	// Page, for the tree, is the one page of a listing answered so (1
	// the first); 0: every page.
	Page int
	// Times is how many requests are answered so (0: all); the rest are
	// answered at once.
	Times int
}

// SetAnswer makes the Hub send its API's answers to verb ("revision" or
// "tree") as a says, from the next request on; the zero Answer sends them
// at once again.
func (h *Hub) SetAnswer(verb string, a Answer) {
	h.mu.Lock()
	h.answers[verb] = &a
	h.mu.Unlock()
}

// answer is how r is to be answered, where SetAnswer shapes it.
func (h *Hub) answer(r *http.Request) (Answer, bool) {
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/datasets/")
	if !ok {
		return Answer{}, false
	}
	parts := strings.SplitN(rest, "/", 4) // owner, name, verb, the rest
	if len(parts) < 3 {
		return Answer{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	a := h.answers[parts[2]]
	if a == nil || *a == (Answer{}) {
		return Answer{}, false
	}
	if a.Page > 0 {
		cursor, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		if cursor/h.PageSize+1 != a.Page {
			return Answer{}, false
		}
	}
	shaped := *a
	if a.Times > 0 {
		if a.Times--; a.Times == 0 {
			*a = Answer{} // the last one so
		}
	}
	return shaped, true
}

// sendAs answers r as a says: what route answers, sent late, slowly or
// never.
func (h *Hub) sendAs(w http.ResponseWriter, r *http.Request, a Answer) {
	hold := func() {
		select {
		case <-r.Context().Done():
		case <-h.closing:
		}
	}
	if a.Silent {
		h.record("hub", r, 0)
		hold()
		return
	}
	answer := httptest.NewRecorder()
	h.route(answer, r)
	maps.Copy(w.Header(), answer.Header())
	w.WriteHeader(answer.Code)
	w.(http.Flusher).Flush()
	if a.Mute {
		hold()
		return
	}
	for _, b := range answer.Body.Bytes() {
		t := time.NewTimer(a.Every)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-h.closing:
			t.Stop()
			return
		}
		if _, err := w.Write([]byte{b}); err != nil {
			return // the client went
		}
		w.(http.Flusher).Flush()
	}
}

// Requests returns a copy of the requests seen so far.
func (h *Hub) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Request(nil), h.requests...)
}

// Downloads counts, by file path, the requests to download a file
// (resolves) among those seen from the from-th on (len(Requests()) taken
// earlier: the downloads since then).
func (h *Hub) Downloads(from int) map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	for _, r := range h.requests[min(from, len(h.requests)):] {
		if _, rest, ok := strings.Cut(r.Path, "/resolve/"); ok && r.Host == "hub" {
			_, path, _ := strings.Cut(rest, "/") // after the revision
			n[path]++
		}
	}
	return n
}

func (h *Hub) record(host string, r *http.Request, status int) {
	h.mu.Lock()
	h.requests = append(h.requests, Request{Host: host, Path: r.URL.Path, Authorization: r.Header.Get("Authorization"), Range: r.Header.Get("Range"), Query: r.URL.RawQuery, Status: status})
	h.mu.Unlock()
}

func (h *Hub) serveHub(w http.ResponseWriter, r *http.Request) {
	rec := &recorder{ResponseWriter: w, h: h, host: "hub", r: r}
	if a, ok := h.answer(r); ok {
		h.sendAs(rec, r, a)
		return
	}
	h.route(rec, r)
}

// recorder logs a request when its status is written, before the client can
// see the answer, so that a test reading Requests after a call sees it.
type recorder struct {
	http.ResponseWriter
	h    *Hub
	host string
	r    *http.Request
	done bool
}

func (w *recorder) WriteHeader(status int) {
	if !w.done {
		w.done = true
		w.h.record(w.host, w.r, status)
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *recorder) Write(p []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

func (w *recorder) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

func (w *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return w.ResponseWriter.(http.Hijacker).Hijack()
}

func (h *Hub) route(w http.ResponseWriter, r *http.Request) int {
	h.mu.Lock()
	limited := h.RateLimited > 0
	if limited {
		h.RateLimited--
	}
	unavailable := !limited && h.Unavailable > 0
	if unavailable {
		h.Unavailable--
	}
	retryAfter := h.RetryAfter
	h.mu.Unlock()
	if unavailable {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
		return http.StatusServiceUnavailable
	}
	if limited {
		w.Header().Set("RateLimit", `"api";r=0;t=0`)
		w.Header().Set("RateLimit-Policy", `"fixed window";"api";q=500;w=300`)
		http.Error(w, "rate limited", http.StatusTooManyRequests)
		return http.StatusTooManyRequests
	}
	h.mu.Lock()
	revoked := h.Revoked
	h.mu.Unlock()
	if revoked != "" && r.Header.Get("Authorization") == "Bearer "+revoked {
		// To a download the Hub adds the RepoNotFound code, which
		// huggingface_hub reports as "Repository Not Found" followed by
		// this message.
		if strings.Contains(r.URL.Path, "/resolve/") {
			w.Header().Set("X-Error-Code", "RepoNotFound")
		}
		w.Header().Set("X-Error-Message", "Invalid credentials in Authorization header")
		http.Error(w, `{"error":"Invalid credentials in Authorization header"}`, http.StatusUnauthorized)
		return http.StatusUnauthorized
	}
	p := r.URL.Path
	var api bool
	if rest, ok := strings.CutPrefix(p, "/api/datasets/"); ok {
		p, api = rest, true
	} else if rest, ok := strings.CutPrefix(p, "/datasets/"); ok {
		p = rest
	} else {
		return notFound(w, "", "")
	}
	parts := strings.SplitN(p, "/", 5) // owner, name, verb, rev, path
	if len(parts) < 4 {
		return notFound(w, "RepoNotFound", "Repository not found")
	}
	repo, verb, rev := parts[0]+"/"+parts[1], parts[2], parts[3]
	path := ""
	if len(parts) == 5 {
		path = parts[4]
	}
	h.mu.Lock()
	files, ok := h.files[repo]
	commit, beforeResolve := h.Commit, h.beforeResolve
	h.mu.Unlock()
	if !ok {
		if r.Header.Get("Authorization") == "" {
			// The Hub does not tell an anonymous reader a missing
			// repository from a private one: both are 401.
			w.Header().Set("X-Error-Code", "RepoNotFound")
			w.Header().Set("X-Error-Message", "Repository not found")
			http.Error(w, `{"error":"Repository not found"}`, http.StatusUnauthorized)
			return http.StatusUnauthorized
		}
		return notFound(w, "RepoNotFound", "Repository not found")
	}
	if !(api && h.PublicListing) {
		if status := h.gate(w, r, repo); status != 0 {
			return status
		}
	}
	if rev != "main" && rev != commit {
		return notFound(w, "RevisionNotFound", "Invalid rev id: "+rev)
	}
	switch {
	case api && verb == "revision":
		gated := any(false)
		if h.Gated {
			gated = "manual"
		}
		writeJSON(w, map[string]any{"id": repo, "sha": commit, "gated": gated})
		return http.StatusOK
	case api && verb == "tree":
		return h.tree(w, r, repo, files, path)
	case !api && verb == "resolve":
		if beforeResolve != nil {
			if err := beforeResolve(r.Context(), repo, path); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return http.StatusServiceUnavailable
			}
		}
		content, ok := files[path]
		if !ok {
			return notFound(w, "EntryNotFound", "Entry not found")
		}
		w.Header().Set("X-Repo-Commit", commit)
		h.mu.Lock()
		lfs := h.lfs[repo+"/"+path]
		body, shaped := h.bodies[repo+"/"+path]
		h.mu.Unlock()
		if !lfs {
			if shaped {
				return h.send(w, r, content, body)
			}
			http.ServeContent(w, r, path, time.Time{}, bytes.NewReader(content))
			return http.StatusOK
		}
		sum := sha256.Sum256(content)
		target := fmt.Sprintf("%s/blobs/%s/%s?X-Amz-Signature=secret", h.CDN.URL, repo, hex.EncodeToString(sum[:]))
		http.Redirect(w, r, target, http.StatusFound)
		return http.StatusFound
	}
	return notFound(w, "", "")
}

func (h *Hub) gate(w http.ResponseWriter, r *http.Request, repo string) int {
	if !h.Gated {
		return 0
	}
	auth := r.Header.Get("Authorization")
	if auth == "" {
		w.Header().Set("X-Error-Code", "GatedRepo")
		w.Header().Set("X-Error-Message", "Access to dataset "+repo+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
		http.Error(w, `{"error":"gated"}`, http.StatusUnauthorized)
		return http.StatusUnauthorized
	}
	h.mu.Lock()
	authorized, fineGrained := h.Authorized, h.FineGrained
	h.mu.Unlock()
	if fineGrained != "" && auth == "Bearer "+fineGrained {
		const msg = "Please enable access to public gated repositories in your fine-grained token settings to view this repository."
		w.Header().Set("X-Error-Message", msg)
		http.Error(w, `{"error":"`+msg+`"}`, http.StatusForbidden)
		return http.StatusForbidden
	}
	if auth != "Bearer "+authorized {
		w.Header().Set("X-Error-Message", "Access to dataset "+repo+" is restricted and you are not in the authorized list. Visit https://huggingface.co/datasets/"+repo+" to ask for access.")
		http.Error(w, `{"error":"not authorized"}`, http.StatusForbidden)
		return http.StatusForbidden
	}
	return 0
}

func (h *Hub) tree(w http.ResponseWriter, r *http.Request, repo string, files map[string][]byte, dir string) int {
	if r.URL.Query().Get("recursive") != "true" {
		http.Error(w, "this fake hub only lists recursively", http.StatusBadRequest)
		return http.StatusBadRequest
	}
	var entries []map[string]any
	dirs := map[string]bool{}
	prefix := ""
	if dir != "" {
		prefix = strings.TrimSuffix(dir, "/") + "/"
	}
	h.mu.Lock()
	for p, content := range files {
		if !strings.HasPrefix(p, prefix) {
			continue
		}
		for d := p; strings.Contains(d, "/"); {
			d = d[:strings.LastIndexByte(d, '/')]
			if strings.HasPrefix(d+"/", prefix) && d+"/" != prefix {
				dirs[d] = true
			}
		}
		e := map[string]any{"type": "file", "path": p, "size": len(content), "oid": gitOID(content)}
		if h.lfs[repo+"/"+p] {
			sum := sha256.Sum256(content)
			e["lfs"] = map[string]any{"oid": hex.EncodeToString(sum[:]), "size": len(content), "pointerSize": 134}
			e["oid"] = gitOID([]byte("pointer " + p))
		}
		entries = append(entries, e)
	}
	h.mu.Unlock()
	if len(entries) == 0 && dir != "" {
		return notFound(w, "EntryNotFound", "Entry not found")
	}
	for d := range dirs {
		entries = append(entries, map[string]any{"type": "directory", "path": d, "size": 0, "oid": gitOID([]byte(d))})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i]["path"].(string) < entries[j]["path"].(string) })
	start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	if h.MorePages != 0 && (start >= len(entries) || start+h.PageSize >= len(entries)) {
		return h.morePages(w, r, entries, start, prefix)
	}
	end := min(start+h.PageSize, len(entries))
	if end < len(entries) || h.LoopPages {
		q := r.URL.Query()
		q.Set("cursor", strconv.Itoa(end%len(entries)))
		w.Header().Set("Link", fmt.Sprintf(`<%s%s?%s>; rel="next"`, h.Server.URL, r.URL.Path, q.Encode()))
	}
	writeJSON(w, entries[start:end])
	return http.StatusOK
}

// morePages answers the listing's page at cursor start where MorePages
// goes on past its real entries: what is left of those, then made-up
// files, and a link to the next cursor until MorePages pages are sent.
func (h *Hub) morePages(w http.ResponseWriter, r *http.Request, entries []map[string]any, start int, prefix string) int {
	page := entries[min(start, len(entries)):min(start+h.PageSize, len(entries))]
	for i := max(start, len(entries)); len(page) < h.PageSize; i++ {
		content := []byte(strconv.Itoa(i))
		page = append(page, map[string]any{"type": "file", "path": fmt.Sprintf("%smore/%09d.parquet", prefix, i-len(entries)),
			"size": len(content), "oid": gitOID(content)})
	}
	end := start + h.PageSize
	if h.MorePages < 0 || end < len(entries)+h.MorePages*h.PageSize {
		q := r.URL.Query()
		q.Set("cursor", strconv.Itoa(end))
		w.Header().Set("Link", fmt.Sprintf(`<%s%s?%s>; rel="next"`, h.Server.URL, r.URL.Path, q.Encode()))
	}
	writeJSON(w, page)
	return http.StatusOK
}

func (h *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	h.cdn(&recorder{ResponseWriter: w, h: h, host: "cdn", r: r}, r)
}

func (h *Hub) cdn(w http.ResponseWriter, r *http.Request) int {
	rest, ok := strings.CutPrefix(r.URL.Path, "/blobs/")
	if !ok || r.URL.Query().Get("X-Amz-Signature") == "" {
		http.Error(w, "AccessDenied", http.StatusForbidden)
		return http.StatusForbidden
	}
	h.mu.Lock()
	forbidden := h.CDNForbidden > 0
	if forbidden {
		h.CDNForbidden--
	}
	h.mu.Unlock()
	if forbidden {
		http.Error(w, "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>", http.StatusForbidden)
		return http.StatusForbidden
	}
	if r.Header.Get("Authorization") != "" {
		// S3 behind a CDN rejects a second credential beside the signature.
		http.Error(w, "InvalidArgument: only one auth mechanism allowed", http.StatusBadRequest)
		return http.StatusBadRequest
	}
	i := strings.LastIndexByte(rest, '/')
	repo, oid := rest[:i], rest[i+1:]
	var content []byte
	var key string
	h.mu.Lock()
	for p, c := range h.files[repo] {
		sum := sha256.Sum256(c)
		if hex.EncodeToString(sum[:]) == oid {
			content, key = c, repo+"/"+p
		}
	}
	breakNow := h.BreakOnce && !h.broken[key] && content != nil
	if breakNow {
		h.broken[key] = true
	}
	stallNow := h.StallOnce && !h.stalled[key] && content != nil
	if stallNow {
		h.stalled[key] = true
	}
	endNow := h.EndEarlyOnce && !h.ended[key] && content != nil
	if endNow {
		h.ended[key] = true
	}
	ignoreRange, cutAfter := h.IgnoreRange, h.CutAfter
	body, shaped := h.bodies[key]
	h.mu.Unlock()
	if content == nil {
		http.Error(w, "NoSuchKey", http.StatusNotFound)
		return http.StatusNotFound
	}
	if shaped {
		return h.send(w, r, content, body)
	}
	if ignoreRange {
		r.Header.Del("Range")
	}
	if breakNow && r.Header.Get("Range") == "" {
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		w.WriteHeader(http.StatusOK)
		w.Write(content[:len(content)/2])
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return -1
	}
	if endNow && r.Header.Get("Range") == "" {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err == nil {
			h.record("cdn", r, http.StatusOK)
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
			buf.Write(content[:len(content)/2])
			buf.Flush()
			conn.Close()
		}
		return -1
	}
	if stallNow && r.Header.Get("Range") == "" {
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		w.WriteHeader(http.StatusOK)
		w.Write(content[:len(content)/2])
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-h.closing:
		}
		return -1
	}
	if cutAfter > 0 {
		w = &cutWriter{ResponseWriter: w, left: cutAfter}
	}
	http.ServeContent(w, r, oid, time.Time{}, bytes.NewReader(content))
	if r.Header.Get("Range") != "" {
		return http.StatusPartialContent
	}
	return http.StatusOK
}

// send answers r with content as b says: from the Range's first byte
// ("bytes=N-"), followed by b.Extra bytes, each after b.Every.
func (h *Hub) send(w http.ResponseWriter, r *http.Request, content []byte, b Body) int {
	from := int64(0)
	status := http.StatusOK
	if first, ok := strings.CutPrefix(r.Header.Get("Range"), "bytes="); ok {
		first, _, _ = strings.Cut(first, "-")
		if n, err := strconv.ParseInt(first, 10, 64); err == nil && n <= int64(len(content)) {
			from, status = n, http.StatusPartialContent
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", n, len(content)-1, len(content)))
		}
	}
	if b.Length && b.Extra >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(int64(len(content))-from+b.Extra, 10))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(status)
	rest := content[from:]
	chunk := 32 << 10
	if b.Every > 0 {
		chunk = 1
	}
	filler := bytes.Repeat([]byte("x"), chunk)
	for sent := int64(0); b.Extra < 0 || sent < int64(len(rest))+b.Extra; {
		var p []byte
		if sent < int64(len(rest)) {
			p = rest[sent:min(sent+int64(chunk), int64(len(rest)))]
		} else {
			p = filler
			if b.Extra >= 0 {
				p = p[:min(int64(len(p)), int64(len(rest))+b.Extra-sent)]
			}
		}
		if b.Every > 0 {
			t := time.NewTimer(b.Every)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
				return status
			case <-h.closing:
				t.Stop()
				return status
			}
		}
		if _, err := w.Write(p); err != nil {
			return status // the client went
		}
		w.(http.Flusher).Flush()
		sent += int64(len(p))
		select {
		case <-h.closing:
			return status
		default:
		}
	}
	return status
}

// cutWriter closes its connection once it has written left bytes of a body.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, net.ErrClosed
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.ResponseWriter.Write(p)
	c.left -= n
	if err == nil && c.left == 0 {
		c.ResponseWriter.(http.Flusher).Flush()
		if conn, _, err := c.ResponseWriter.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
		return n, net.ErrClosed
	}
	return n, err
}

func notFound(w http.ResponseWriter, code, msg string) int {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
		w.Header().Set("X-Error-Message", msg)
	}
	http.Error(w, `{"error":"`+msg+`"}`, http.StatusNotFound)
	return http.StatusNotFound
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// gitOID is git's blob id for content.
func gitOID(content []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write(content)
	return hex.EncodeToString(h.Sum(nil))
}
