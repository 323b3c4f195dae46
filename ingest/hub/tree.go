package hub

import (
	"context"
	"fmt"
	"net/url"
	"strings"
)

// File is one file of a dataset repository, as the tree API describes it.
type File struct {
	Path string `json:"path"`
	Type string `json:"type"` // "file" or "directory"
	Size int64  `json:"size"`
	// OID is the git blob id (sha1 of "blob <size>\x00" + content).
	OID string `json:"oid"`
	// LFS is set for files stored in LFS; its OID is the content's sha256.
	LFS *LFS `json:"lfs,omitempty"`
}

// LFS is the LFS pointer of a file.
type LFS struct {
	OID  string `json:"oid"`
	Size int64  `json:"size"`
}

// ResolveRevision returns the commit that rev (a branch, tag or commit)
// names in dataset repo, so that an ingest can record what it read.
func (c *Client) ResolveRevision(ctx context.Context, repo, rev string) (string, error) {
	if err := checkRepo(repo); err != nil {
		return "", err
	}
	u := fmt.Sprintf("%s/api/datasets/%s/revision/%s", c.cfg.Endpoint, repo, url.PathEscape(rev))
	var info struct {
		SHA   string `json:"sha"`
		Gated any    `json:"gated"` // false, "auto" or "manual"
	}
	if _, err := c.getJSON(ctx, repo, u, &info); err != nil {
		return "", fmt.Errorf("resolving revision %q of dataset %s: %w", rev, repo, err)
	}
	if len(info.SHA) != 40 {
		return "", fmt.Errorf("resolving revision %q of dataset %s: the hub answered no commit (%q)", rev, repo, info.SHA)
	}
	// The Hub lists a gated dataset's files for all and refuses only their
	// downloads: without a token, say so before an ingest is planned.
	if g, ok := info.Gated.(string); ok && g != "" && c.cfg.Token == "" {
		return "", &GatedError{Repo: repo, Page: c.DatasetPage(repo), TokenFrom: c.cfg.TokenFrom}
	}
	return info.SHA, nil
}

// List returns every file under dir (recursively) at revision rev, following
// the tree API's pagination through the Link header. Directories are left out.
func (c *Client) List(ctx context.Context, repo, rev, dir string) ([]File, error) {
	if err := checkRepo(repo); err != nil {
		return nil, err
	}
	next := fmt.Sprintf("%s/api/datasets/%s/tree/%s", c.cfg.Endpoint, repo, url.PathEscape(rev))
	if dir = strings.Trim(dir, "/"); dir != "" {
		next += "/" + escapePath(dir)
	}
	next += "?recursive=true&expand=false"
	var files []File
	// A listing whose next page is one already read, or that goes on
	// after a page of nothing, would never end: it is refused. So is one
	// that goes on past MaxEntries, each page linking to a new one.
	seen := map[string]bool{}
	entries, pages := 0, 0
	for next != "" {
		pages++
		if seen[next] {
			return nil, fmt.Errorf("listing dataset %s at %s: the Hub's next page, %s, is one already read: its listing loops (a proxy or cache between here and %s may be at fault); try again later", repo, rev, redact(next), c.host)
		}
		seen[next] = true
		var page []File
		h, err := c.getJSON(ctx, repo, next, &page)
		if err != nil && pages > 1 {
			// The pages after the first are asked for at the same
			// address, with a cursor that errors leave out.
			return nil, fmt.Errorf("listing dataset %s at %s, page %d (after %d entries): %w", repo, rev, pages, entries, err)
		}
		if err != nil {
			return nil, fmt.Errorf("listing dataset %s at %s: %w", repo, rev, err)
		}
		if entries += len(page); entries > c.cfg.MaxEntries {
			named, _ := c.endpointSetting()
			return nil, fmt.Errorf("listing dataset %s at %s: the Hub's listing goes on past %d entries (files and folders), the most one listing reads: the Hub asks a dataset to keep under 100,000 files, so a mirror, proxy or cache between here and %s may be sending pages without end; check it, or split the preset's include patterns by folder, each of which is listed on its own",
				repo, rev, c.cfg.MaxEntries, named)
		}
		for _, f := range page {
			if f.Type == "file" || f.Type == "" {
				files = append(files, f)
			}
		}
		this := next
		next = nextLink(h.Get("Link"))
		if next != "" && len(page) == 0 {
			return nil, fmt.Errorf("listing dataset %s at %s: the Hub answered an empty page that links to another (%s): its listing does not end; try again later", repo, rev, redact(this))
		}
		if next != "" {
			// A relative next link is resolved against the endpoint; an
			// absolute one to another host would carry our token elsewhere.
			ref, err := url.Parse(next)
			if err != nil {
				return nil, fmt.Errorf("listing dataset %s: bad Link header %q: %w", repo, next, err)
			}
			base, _ := url.Parse(c.cfg.Endpoint)
			abs := base.ResolveReference(ref)
			if abs.Host != c.host {
				return nil, fmt.Errorf("listing dataset %s: the next page points to another host (%s)", repo, abs.Host)
			}
			next = abs.String()
		}
	}
	return files, nil
}

// nextLink extracts the rel="next" target of an RFC 8288 Link header.
func nextLink(h string) string {
	for _, part := range strings.Split(h, ",") {
		target, params, ok := strings.Cut(part, ";")
		if !ok {
			continue
		}
		for _, p := range strings.Split(params, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
			if strings.EqualFold(k, "rel") && strings.Trim(v, `"`) == "next" {
				return strings.Trim(strings.TrimSpace(target), "<>")
			}
		}
	}
	return ""
}

// checkRepo rejects names that are not "owner/name" before they reach a URL.
func checkRepo(repo string) error {
	owner, name, ok := strings.Cut(repo, "/")
	if !ok || owner == "" || name == "" || strings.ContainsAny(repo, "?#%\\ ") || strings.Count(repo, "/") != 1 || strings.Contains(repo, "..") {
		return &BadInputError{fmt.Errorf("dataset %q is not an owner/name repository id (for example bigcode/the-stack-v2-dedup)", repo)}
	}
	return nil
}
