package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// While object storage does not answer, `sched tokenizers` lists the
// tokenizers this machine holds, with the stores that use them, and prints
// a report it holds, saying that the runs are not known until the store
// answers (the note on stderr says so, and that a tokenizer only object
// storage holds shows then too).
func TestTokenizersListsThisMachinesCopiesWhileObjectStorageIsDown(t *testing.T) {
	s3 := testsvc.S3(t)
	env := append(baseEnv(t), "KILN_TOKENIZER=kiln-bpe", "KILN_S3_ENDPOINT="+s3.Endpoint,
		"KILN_S3_ACCESS_KEY="+s3.AccessKey, "KILN_S3_SECRET_KEY="+s3.SecretKey)
	data := envValue(env, "KILN_DATA_DIR")
	ctx := context.Background()
	objects, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	cat := catalog.New(objects, data)
	e, err := cat.Publish(ctx, "kiln-bpe", trainSmall(t, "alpha beta gamma delta"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.PutReport(ctx, catalog.Report{Name: "kiln-bpe", SHA256: e.SHA256, VocabSize: e.VocabSize, SpecialTokens: e.Special,
		Sources: []catalog.SourceReport{{Source: "fineweb-edu", Documents: 3, Bytes: 300, Figures: catalog.Figures{Tokens: 100, BytesPerToken: 3}}}}); err != nil {
		t.Fatal(err)
	}
	tj, err := os.ReadFile(e.Path)
	if err != nil {
		t.Fatal(err)
	}
	writeStore(t, filepath.Join(data, "tokens", "web"), tj)

	s3.Stop()
	out, errOut, code := sched(t, env, "tokenizers")
	if code != 0 || !regexp.MustCompile(`kiln-bpe \(default\)\s+\d+\s+`+e.SHA256[:12]+`\s+web\s+\?`).MatchString(out) {
		t.Fatalf("tokenizers with object storage down: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "object storage at "+s3.URL()+" does not answer") || !strings.Contains(errOut, "this machine's copies") {
		t.Errorf("tokenizers with object storage down does not say so:\n%s", errOut)
	}
	out, errOut, code = sched(t, env, "tokenizers", "kiln-bpe")
	if code != 0 || !strings.Contains(out, "| fineweb-edu | 3 | 300 | 100 | 3.000 |") {
		t.Fatalf("report with object storage down: exit %d\n%s%s", code, out, errOut)
	}
	_, errOut, code = sched(t, env, "tokenizers", "other")
	if code != 2 || !strings.Contains(errOut, `tokenizer "other" is not known`) {
		t.Fatalf("a tokenizer this machine lacks, object storage down: exit %d, %q", code, errOut)
	}
}
