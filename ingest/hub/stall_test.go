package hub_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// notesOf is ctx under which the retry notices the client gives are kept,
// and a function that returns them so far.
func notesOf(ctx context.Context) (context.Context, func() string) {
	var mu sync.Mutex
	var notes []string
	ctx = hub.WithRetryNotice(ctx, func(msg string) {
		mu.Lock()
		notes = append(notes, msg)
		mu.Unlock()
	})
	return ctx, func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(notes, "\n")
	}
}

// requestsTo counts the Hub's requests whose path holds path and whose
// query holds query.
func requestsTo(h *hubtest.Hub, path, query string) int {
	n := 0
	for _, r := range h.Requests() {
		if r.Host == "hub" && strings.Contains(r.Path, path) && strings.Contains(r.Query, query) {
			n++
		}
	}
	return n
}

// A page of a listing that trickles (a byte every 10 ms against a floor of
// 2,000 bytes a second; its 100 entries would take minutes) held `sched
// datasets check`, the planning of an ingest and its queued task for as
// long as the server kept the connection open: the floor downloads are
// under is the page's too. A page that trickles once is asked for again,
// and the listing is whole; one that trickles each time fails after
// MaxRetries more, naming the dataset, the page and what to check.
func TestAListingPageThatTricklesFailsAsStalled(t *testing.T) {
	h := newHub(t)
	h.PageSize = 100
	for i := range 199 { // and the folder data: 200 entries
		h.Add(repo, fmt.Sprintf("data/%03d.parquet", i), []byte{byte(i)}, false)
	}
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 2, MaxWait: time.Millisecond,
		MinRate: 2000, RateWindow: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, notes := notesOf(context.Background())

	h.SetAnswer("tree", hubtest.Answer{Every: 10 * time.Millisecond, Page: 2, Times: 1})
	files, err := c.List(ctx, repo, "main", "")
	if err != nil || len(files) != 199 {
		t.Fatalf("a listing whose second page trickled once: %d files, %v; want the 199 files", len(files), err)
	}
	if n := requestsTo(h, "/tree/", "cursor=100"); n != 2 {
		t.Fatalf("the page that trickled once was asked for %d times; want twice", n)
	}
	if said := notes(); !strings.Contains(said, "an answer must keep up (the connection stalled); trying again in") {
		t.Fatalf("the task was told %q; want that the page was too slow, and is asked for again", said)
	}

	h.SetAnswer("tree", hubtest.Answer{Every: 10 * time.Millisecond, Page: 2})
	before := requestsTo(h, "/tree/", "cursor=100")
	files, err = c.List(ctx, repo, "main", "")
	if err == nil {
		t.Fatalf("a listing whose second page trickles each time: %d files, no error; want it given up on", len(files))
	}
	for _, w := range []string{
		"listing dataset " + repo + " at main, page 2 (after 100 entries): ",
		"B/s), under the 2.0 KiB/s an answer must keep up (the connection stalled) (given up after 3 attempts at GET " + h.Server.URL + "/api/datasets/" + repo + "/tree/main)",
		"the Hub at HF_ENDPOINT " + h.Server.URL + " sent nothing, or too little, each time; check this machine's network and proxy",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("a page that trickles each time says %q; want %q", err, w)
		}
	}
	if n := requestsTo(h, "/tree/", "cursor=100") - before; n != 3 {
		t.Fatalf("the page that trickles was asked for %d times; want 3 (MaxRetries 2)", n)
	}
}

// A Hub (or a proxy or mirror in its stead) that takes the request for a
// revision or a listing and answers nothing, only its headers, or its body
// byte by byte, fails the attempt as a stall and is asked again, MaxRetries
// more times, as a request that failed is; then the call fails naming the
// dataset, the request, and what to check: the network, the proxy,
// HF_ENDPOINT. Headers and nothing more failed at the first attempt, as an
// answer that was not JSON; the trickle held the call for as long as it
// went on.
func TestAnAnswerThatNeverComesIsGivenUpOn(t *testing.T) {
	cases := []struct {
		name, verb string
		answer     hubtest.Answer
		said       string
	}{
		{"revision-silent", "revision", hubtest.Answer{Silent: true}, "nothing arrived for 100ms (the connection stalled)"},
		{"revision-headers-only", "revision", hubtest.Answer{Mute: true}, "nothing arrived for 100ms (the connection stalled)"},
		{"revision-trickle", "revision", hubtest.Answer{Every: 10 * time.Millisecond}, "B/s), under the 2.0 KiB/s an answer must keep up (the connection stalled)"},
		{"tree-silent", "tree", hubtest.Answer{Silent: true}, "nothing arrived for 100ms (the connection stalled)"},
		{"tree-headers-only", "tree", hubtest.Answer{Mute: true}, "nothing arrived for 100ms (the connection stalled)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(t)
			h.Add(repo, "data/a.parquet", []byte("a"), false)
			h.SetAnswer(tc.verb, tc.answer)
			cfg := hub.Config{Endpoint: h.Server.URL, MaxRetries: 2, MaxWait: time.Millisecond,
				MinRate: 2000, RateWindow: 50 * time.Millisecond}
			if tc.answer.Every == 0 {
				// What must pass for the stall: only the answers the test
				// holds are asked for.
				cfg.StallTimeout = 100 * time.Millisecond
			}
			c, err := hub.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, notes := notesOf(context.Background())
			var what string
			if tc.verb == "revision" {
				_, err = c.ResolveRevision(ctx, repo, "main")
				what = `resolving revision "main" of dataset ` + repo + ": "
			} else {
				_, err = c.List(ctx, repo, "main", "")
				what = "listing dataset " + repo + " at main: "
			}
			if err == nil {
				t.Fatal("an answer that never comes whole: no error; want it given up on")
			}
			for _, w := range []string{what, tc.said,
				"(given up after 3 attempts at GET " + h.Server.URL + "/api/datasets/" + repo + "/" + tc.verb + "/main)",
				"the Hub at HF_ENDPOINT " + h.Server.URL + " sent nothing, or too little, each time; check this machine's network and proxy",
			} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("an answer that never comes whole says %q; want %q", err, w)
				}
			}
			if n := requestsTo(h, "/"+tc.verb+"/", ""); n != 3 {
				t.Fatalf("the Hub was asked %d times; want 3 (MaxRetries 2)", n)
			}
			if said := notes(); !strings.Contains(said, "(the connection stalled); trying again in") {
				t.Fatalf("the task was told %q; want that the answer stalled, and is asked for again", said)
			}
		})
	}
}

// A read of part of a file (a parquet footer, which `sched datasets check`
// reads) whose answer trickles from the CDN is under the same floor, and
// is given up on naming the file and the CDN's host: 100,000 bytes at a
// byte every 10 ms held it for the better part of 20 minutes.
func TestAReadRangeThatTricklesIsGivenUpOn(t *testing.T) {
	h := newHub(t)
	content := randomBytes(t, 100_000)
	h.Add(repo, "data/a.parquet", content, true)
	h.SetBody(repo, "data/a.parquet", hubtest.Body{Every: 10 * time.Millisecond})
	c, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 2, MaxWait: time.Millisecond,
		MinRate: 2000, RateWindow: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ReadRange(context.Background(), repo, "main", "data/a.parquet", 0, int64(len(content)))
	if err == nil {
		t.Fatal("a read of a range that trickles: no error; want it given up on")
	}
	cdn := strings.TrimPrefix(h.CDN.URL, "http://")
	for _, w := range []string{"reading data/a.parquet of dataset " + repo + ": ",
		"B/s), under the 2.0 KiB/s an answer must keep up (the connection stalled) (given up after 3 attempts at GET " + h.Server.URL + "/datasets/" + repo + "/resolve/main/data/a.parquet)",
		cdn + ", where the Hub sent the request on, sent nothing, or too little, each time; check that this machine's network and proxy let it through",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("a read of a range that trickles says %q; want %q", err, w)
		}
	}
	if n := h.Downloads(0)["data/a.parquet"]; n != 3 {
		t.Fatalf("the range was asked for %d times; want 3 (MaxRetries 2)", n)
	}
}
