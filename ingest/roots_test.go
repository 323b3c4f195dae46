package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

func TestCheckLocalPathKeepsToItsRoots(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	in := filepath.Join(root, "sub", "a.txt")
	os.MkdirAll(filepath.Dir(in), 0o755)
	os.WriteFile(in, []byte("x"), 0o644)
	secret := filepath.Join(outside, "secret.txt")
	os.WriteFile(secret, []byte("y"), 0o644)
	// A link inside the root that leads out of it, and one that stays in.
	os.Symlink(secret, filepath.Join(root, "escape.txt"))
	os.Symlink(in, filepath.Join(root, "inside.txt"))

	for _, ok := range []string{in, filepath.Join(root, "inside.txt"), filepath.Join(root, "sub", "..", "sub", "a.txt"), filepath.Join(root, "missing.txt")} {
		if err := CheckLocalPath([]string{root}, ok); err != nil {
			t.Errorf("CheckLocalPath(%s) = %v; want it accepted", ok, err)
		}
	}
	for _, bad := range []string{secret, "/etc/passwd", filepath.Join(root, "escape.txt"), filepath.Join(root, "..", filepath.Base(outside), "secret.txt"), root + "-sibling/x"} {
		err := CheckLocalPath([]string{root}, bad)
		var out *OutsideRootsError
		if !errors.As(err, &out) || !out.BadInput() || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "KILN_LOCAL_ROOTS") {
			t.Errorf("CheckLocalPath(%s) = %v; want an OutsideRootsError naming the path and KILN_LOCAL_ROOTS", bad, err)
		}
	}
	// The link is said to lead out, and where: its own path is in a root.
	if err := CheckLocalPath([]string{root}, filepath.Join(root, "escape.txt")); err == nil || !strings.Contains(err.Error(), "leads through a symbolic link to "+secret+", outside") {
		t.Errorf("a link out of the root: %v; want it said where it leads", err)
	}
	if err := CheckLocalPath(nil, in); err == nil || !strings.Contains(err.Error(), "reads no local files") {
		t.Errorf("with no roots: %v; want every local file refused", err)
	}
}

// A plan or a shard task naming a local file outside the worker's roots is
// refused before anything is read or stored, as bad input (final).
func TestPipelineRefusesLocalPathsOutsideItsRoots(t *testing.T) {
	ctx := context.Background()
	tok := testTokenizer(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir(), LocalRoots: []string{root},
		Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return tok, nil }}

	_, _, err = p.Shard(ctx, ShardJob{Path: "/etc/passwd", Store: "s", Tokenizer: "t", ShardID: "local/x"}, nil)
	var out *OutsideRootsError
	if !errors.As(err, &out) || out.Path != "/etc/passwd" {
		t.Fatalf("shard of /etc/passwd: %v; want an OutsideRootsError", err)
	}
	_, err = p.Plan(ctx, PlanJob{Dataset: "local:/etc/pass*", Store: "s", Tokenizer: "t"})
	if !errors.As(err, &out) {
		t.Fatalf("plan of local:/etc/pass*: %v; want an OutsideRootsError", err)
	}
	if list, err := objects.List(ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("objects written for refused tasks: %v %v", list, err)
	}

	os.WriteFile(filepath.Join(root, "a.txt"), []byte("func main() {}\n"), 0o644)
	res, err := p.Plan(ctx, PlanJob{Dataset: "local:" + filepath.Join(root, "*.txt"), Store: "s", Tokenizer: "t"})
	if err != nil || len(res.Shards) != 1 {
		t.Fatalf("plan inside the root: %+v, %v", res, err)
	}
	a, done, err := p.Shard(ctx, res.Shards[0], nil)
	if err != nil || done || a.Documents != 1 {
		t.Fatalf("shard inside the root: %+v, %v, %v", a, done, err)
	}
}
