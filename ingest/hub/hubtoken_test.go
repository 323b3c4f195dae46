package hub_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// A client of the environment's settings (a worker's tokenizer tasks
// without a client of their own) names the variable its token came from:
// HUGGING_FACE_HUB_TOKEN, HF_TOKEN's older name, where HF_TOKEN is unset,
// and HF_TOKEN, read over it, where both are set; HF_TOKEN where neither
// is, as before.
func TestEnvironmentNamesTheVariableOfItsToken(t *testing.T) {
	h := newHub(t)
	h.Gated, h.Authorized, h.Revoked = true, "hf_good", "hf_revoked"
	h.Add(repo, "a.jsonl", []byte(`{"text":"x"}`+"\n"), false)
	t.Setenv("HF_ENDPOINT", h.Server.URL)
	page := h.Server.URL + "/datasets/" + repo
	for _, c := range []struct {
		hfToken, older, want string
	}{
		{"", "hf_bad", "dataset " + repo + " is gated and this HUGGING_FACE_HUB_TOKEN (HF_TOKEN's older name, read as HF_TOKEN is unset) is not in its authorized list"},
		{"hf_bad", "hf_good", "dataset " + repo + " is gated and this HF_TOKEN (read over HUGGING_FACE_HUB_TOKEN, also set) is not in its authorized list"},
		{"hf_bad", "", "dataset " + repo + " is gated and this HF_TOKEN is not in its authorized list"},
		{"", "", "dataset " + repo + " is gated: accept its terms at " + page + " and set HF_TOKEN"},
		{"", "hf_revoked", "the Hub refused HUGGING_FACE_HUB_TOKEN (HF_TOKEN's older name, read as HF_TOKEN is unset) for dataset " + repo + " (401: Invalid credentials in Authorization header): the token is invalid or expired; set HUGGING_FACE_HUB_TOKEN to a token from"},
	} {
		t.Setenv("HF_TOKEN", c.hfToken)
		t.Setenv("HUGGING_FACE_HUB_TOKEN", c.older)
		cfg := hub.Environment()
		cfg.MaxRetries = 1
		cl, err := hub.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cl.ResolveRevision(context.Background(), repo, "main")
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("HF_TOKEN=%q HUGGING_FACE_HUB_TOKEN=%q: %v; want it to hold %q", c.hfToken, c.older, err, c.want)
		}
	}
}
