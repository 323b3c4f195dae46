package hub_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// No error of the hub client shows the token or a password written into
// HF_ENDPOINT, whichever way the request ends.
func TestErrorsShowNoSecret(t *testing.T) {
	const pw, token = "s3cretPw", "hf_s3cretToken"
	h := newHub(t)
	h.Gated, h.Authorized = true, "good"
	h.Add(repo, "a.txt", []byte("a"), false)
	ctx := context.Background()
	withPw := strings.Replace(h.Server.URL, "http://", "http://user:"+pw+"@", 1)

	var errs []error
	if _, err := hub.New(hub.Config{Endpoint: "ftp://user:" + pw + "@example.org"}); err != nil {
		errs = append(errs, err)
	}
	for _, endpoint := range []string{withPw, "http://user:" + pw + "@127.0.0.1:1"} {
		c, err := hub.New(hub.Config{Endpoint: endpoint, Token: token, MaxRetries: 1})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.List(ctx, repo, "main", "")           // gated: the token is refused
		_, err2 := c.List(ctx, "owner/none", "main", "") // not found
		errs = append(errs, err, err2)
	}
	for _, err := range errs {
		if err == nil {
			t.Fatal("a request that had to fail succeeded")
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(err.Error(), token) {
			t.Errorf("error shows a secret: %v", err)
		}
	}
}
