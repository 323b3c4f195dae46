package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-lm/kiln/tokens"
)

// Usage is who uses which tokenizer, keyed by the tokenizer's SHA-256.
type Usage struct {
	Stores map[string][]string // sha256 -> token store names
	Runs   map[string][]string // sha256 -> run names
	// Unreadable lists stores whose manifest could not be read, with why:
	// shown, not hidden, so a broken store is noticed.
	Unreadable []string
}

// Stores scans the token stores under tokensDir (each a directory with a
// manifest.json) and records which tokenizer made each.
func (u *Usage) scanStores(ctx context.Context, tokensDir string) error {
	dirs, err := os.ReadDir(tokensDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list token stores in %s: %w", tokensDir, err)
	}
	for _, d := range dirs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !d.IsDir() {
			continue
		}
		dir := filepath.Join(tokensDir, d.Name())
		if _, err := os.Stat(filepath.Join(dir, tokens.ManifestFile)); err != nil {
			continue
		}
		m, err := tokens.ReadManifest(dir)
		if err != nil {
			u.Unreadable = append(u.Unreadable, err.Error())
			continue
		}
		u.Stores[m.Tokenizer.SHA256] = append(u.Stores[m.Tokenizer.SHA256], d.Name())
	}
	return nil
}

// scanRuns hashes the tokenizer.json of each run's newest checkpoint in
// object storage (checkpoints/<run>/step-NNNNNNN/tokenizer.json): the
// checkpoint carries the tokenizer it was trained with.
func (u *Usage) scanRuns(ctx context.Context, c *Catalog) error {
	if c.Objects == nil {
		return nil
	}
	infos, err := c.Objects.List(ctx, "checkpoints/")
	if err != nil {
		return fmt.Errorf("list checkpoints/: %w", err)
	}
	newest := map[string]string{} // run -> key; keys sort by zero-padded step
	for _, in := range infos {
		parts := strings.Split(in.Key, "/")
		if len(parts) == 4 && parts[3] == FileName && strings.HasPrefix(parts[2], "step-") {
			if in.Key > newest[parts[1]] {
				newest[parts[1]] = in.Key
			}
		}
	}
	for _, run := range slices.Sorted(maps.Keys(newest)) {
		rc, err := c.Objects.Get(ctx, newest[run])
		if err != nil {
			return fmt.Errorf("get %s: %w", newest[run], err)
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("get %s: %w", newest[run], err)
		}
		s := hex.EncodeToString(h.Sum(nil))
		u.Runs[s] = append(u.Runs[s], run)
	}
	return nil
}

// Usage finds the token stores under tokensDir and the runs in object
// storage that use each tokenizer.
func (c *Catalog) Usage(ctx context.Context, tokensDir string) (Usage, error) {
	u := Usage{Stores: map[string][]string{}, Runs: map[string][]string{}}
	if err := u.scanStores(ctx, tokensDir); err != nil {
		return u, err
	}
	if err := u.scanRuns(ctx, c); err != nil {
		return u, err
	}
	return u, nil
}
