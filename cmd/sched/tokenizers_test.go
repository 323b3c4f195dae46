package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer/catalog"
)

// `sched tokenizers` lists each tokenizer with the stores and runs that use
// it, flags a store made by a tokenizer it does not know, and prints a
// tokenizer's report by name.
func TestTokenizersCommand(t *testing.T) {
	env := baseEnv(t)
	data := envValue(env, "KILN_DATA_DIR")
	ctx := context.Background()
	objects, err := store.NewLocal(filepath.Join(data, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	cat := catalog.New(objects, data)
	a, b, stray := trainSmall(t, "alpha beta gamma delta"), trainSmall(t, "one two three four five"), trainSmall(t, "x y z w v u")
	ea, err := cat.Publish(ctx, "kiln-bpe", a)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := cat.Publish(ctx, "other", b)
	if err != nil {
		t.Fatal(err)
	}
	if err := cat.PutReport(ctx, catalog.Report{Name: "other", SHA256: eb.SHA256, VocabSize: eb.VocabSize, SpecialTokens: eb.Special,
		Sources: []catalog.SourceReport{{Source: "fineweb-edu", Documents: 3, Bytes: 300, Figures: catalog.Figures{Tokens: 100, BytesPerToken: 3}}}}); err != nil {
		t.Fatal(err)
	}
	for name, tj := range map[string][]byte{"web": a, "code": a, "maths": b, "strays": stray} {
		writeStore(t, filepath.Join(data, "tokens", name), tj)
	}
	objects.Put(ctx, "checkpoints/pilot/step-0000100/tokenizer.json", bytes.NewReader(a), int64(len(a)))

	out, errOut, code := sched(t, env, "tokenizers")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, re := range []string{
		`kiln-bpe \(default\)\s+\d+\s+` + ea.SHA256[:12] + `\s+code,web\s+pilot`,
		`other\s+\d+\s+` + eb.SHA256[:12] + `\s+maths\s+-`,
		`\(unknown\)\s+-\s+\w{12}\s+strays\s+-`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}
	out, _, code = sched(t, env, "tokenizers", "other")
	if code != 0 || !strings.Contains(out, "| fineweb-edu | 3 | 300 | 100 | 3.000 |") {
		t.Fatalf("report: exit %d\n%s", code, out)
	}
	_, errOut, code = sched(t, env, "tokenizers", "missing")
	if code != 2 || !strings.Contains(errOut, `tokenizer "missing" is not known (known: kiln-bpe, other)`) {
		t.Fatalf("unknown name: exit %d, %q", code, errOut)
	}
}
