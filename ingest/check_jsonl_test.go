package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// The check of a hub dataset of JSON lines (.jsonl, and .jsonl.gz or
// .jsonl.zst as the proof-pile-2 preset reads) reads its first file's head
// as an ingest reads the file: a field misspelt, which an ingest would
// take for a store of skipped records, is refused naming the field, the
// file and the fields its lines have, and the right field is said read
// with its first document's length. Its head alone is fetched.
func TestCheckReadsAHubJSONLinesFilesHead(t *testing.T) {
	t.Parallel()
	h := hubtest.New()
	defer h.Close()
	body := `{"id":1,"text":"the quick brown fox"}` + "\n" + `{"id":2,"text":"jumps"}` + "\n"
	exts := []string{".jsonl", ".jsonl.gz", ".jsonl.zst"}
	for i, ext := range exts {
		h.Add(fmt.Sprintf("owner/lines-%d", i), "train/part-0"+ext, compressedAs(t, ext, []byte(body)), true)
	}
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, ext := range exts {
		p := Preset{Name: "lines", Repo: fmt.Sprintf("owner/lines-%d", i), Revision: "main", Include: []string{"train/*" + ext}}
		res, err := Check(ctx, p, hc)
		if err != nil || res.Format != FormatJSONL || res.FirstDocument != len("the quick brown fox") {
			t.Errorf("%s with the field text: %+v, %v; want JSON lines, its first document read", ext, res, err)
		}
		p.Columns = Columns{Text: "nosuchfield"}
		res, err = Check(ctx, p, hc)
		var pe *PresetError
		want := []string{"train/part-0" + ext, `"nosuchfield"`, "the 2 lines of it that the check read, every one skipped", `its first line has the fields ["id" "text"]`, "--columns text=<field>"}
		for _, w := range want {
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), w) {
				t.Errorf("%s with the field nosuchfield: %+v, %v; want a preset error saying %q", ext, res, err, w)
				break
			}
		}
	}
	for _, r := range h.Requests() {
		if r.Host == "cdn" && r.Range == "" {
			t.Errorf("the check downloaded a whole file: %+v", r)
		}
	}
}

// A line of a hub JSON lines file that is not a JSON object, for which an
// ingest skips the file as corrupt, is refused by the check naming the file
// and the line.
func TestCheckRefusesAHubJSONLinesFileThatIsNotJSON(t *testing.T) {
	t.Parallel()
	h := hubtest.New()
	defer h.Close()
	h.Add("owner/lines", "train/part-0.jsonl.zst", compressedAs(t, ".zst", []byte(`{"text":"a"}`+"\n"+"not json\n")), true)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	p := Preset{Name: "lines", Repo: "owner/lines", Revision: "main", Include: []string{"train/*.jsonl.zst"}}
	// The first document is good: the file is refused for its second line.
	if _, err := Check(context.Background(), p, hc); err != nil {
		t.Fatalf("a file whose first line is good: %v; want it passed, as its first document is read", err)
	}
	h.Add("owner/lines", "train/part-0.jsonl.zst", compressedAs(t, ".zst", []byte("not json\n"+`{"text":"a"}`+"\n")), true)
	var pe *PresetError
	if _, err := Check(context.Background(), p, hc); !errors.As(err, &pe) || !strings.Contains(err.Error(), "train/part-0.jsonl.zst") ||
		!strings.Contains(err.Error(), "line 1 is not a JSON object") {
		t.Fatalf("a file whose first line is not JSON: %v; want it refused naming the file and its line", err)
	}
}

// The check of a gated hub dataset of JSON lines, whose files the Hub
// lists for all, asks for a file's bytes as the ingest does: a token the
// Hub does not take is refused as the ingest's download is, naming
// HF_TOKEN, as none is (the plan knows the dataset gated); the authorized
// token passes.
func TestCheckOfAGatedJSONLinesDatasetRefusesAWrongToken(t *testing.T) {
	t.Parallel()
	h := hubtest.New()
	defer h.Close()
	h.Gated, h.PublicListing, h.Authorized = true, true, "hf_good"
	h.Add("owner/gated", "train/part-0.jsonl.zst", compressedAs(t, ".zst", []byte(`{"text":"a"}`+"\n")), true)
	p := Preset{Name: "gated", Repo: "owner/gated", Revision: "main", Include: []string{"train/*.jsonl.zst"}}
	check := func(token string) error {
		hc, err := hub.New(hub.Config{Endpoint: h.Server.URL, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		_, err = Check(context.Background(), p, hc)
		return err
	}
	for token, want := range map[string]string{
		"hf_wrong": "dataset owner/gated is gated and this HF_TOKEN is not in its authorized list",
		"":         "dataset owner/gated is gated: accept its terms at " + h.Server.URL + "/datasets/owner/gated and set HF_TOKEN",
	} {
		err := check(token)
		var g *hub.GatedError
		if !errors.As(err, &g) || !strings.Contains(err.Error(), want) {
			t.Errorf("token %q: %v; want the Hub's refusal, %q", token, err, want)
		}
		if token != "" && strings.Contains(fmt.Sprint(err), token) {
			t.Errorf("token %q: the error %q shows the token", token, err)
		}
	}
	if err := check("hf_good"); err != nil {
		t.Errorf("the authorized token: %v", err)
	}
}
