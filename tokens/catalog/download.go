package catalog

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// SumsFile is the file beside a published tokenizer.json that holds its
// SHA-256, in sha256sum's format ("<hex>  tokenizer.json"), so that
// 'sha256sum -c SHA256SUMS' checks a copy of the two.
const SumsFile = "SHA256SUMS"

// SumsKey is the object key of tokenizer name's SumsFile.
func SumsKey(name string) string { return Prefix + name + "/" + SumsFile }

// sumsLine is SumsFile's content for tokenizer.json bytes data.
func sumsLine(data []byte) []byte { return []byte(sha(data) + "  " + FileName + "\n") }

// downloadReads is how many times a tokenizer.json that does not match
// what was published with it is read before the download is given up: a
// byte changed on its way (a network fault, a proxy that alters bodies)
// is seldom changed the same way twice.
const downloadReads = 4

// DownloadError is a tokenizer.json that object storage sent, read after
// read, with bytes other than those published: nothing of it was saved or
// used. It is no bad input (the published tokenizer is intact as far as
// anyone knows), so a task that meets it is tried again.
type DownloadError struct {
	Name string
	// Want is the published SHA-256 and From the object that holds it;
	// both empty for a tokenizer published with none, whose reads never
	// came twice the same.
	Want, From string
	// Got is the SHA-256 of each distinct read.
	Got []string
	// Reads is how many times it was read.
	Reads int
	// last is the last read.
	last []byte
}

// listed is what a listing says of e: where every read came the same and
// does not load (a tokenizer.json damaged in the bucket, or by a proxy
// the same way each time), that it does not load, as for a tokenizer
// published with no hash, and that it is not the published one.
func (e *DownloadError) listed() string {
	if len(e.Got) == 1 {
		if _, err := tokenizer.Parse(e.last); err != nil {
			return fmt.Sprintf("%s in object storage: %v; every read came so, sha256 %.12s, not the published %.12s (changed in the bucket, or on its way here)", Key(e.Name), err, e.Got[0], e.Want)
		}
	}
	return e.Error()
}

func (e *DownloadError) Error() string {
	got := make([]string, len(e.Got))
	for i, s := range e.Got {
		got[i] = s[:min(len(s), 12)]
	}
	const fix = "something between here and object storage (a network fault, a proxy) changes what it sends: mend that and try again"
	if e.Want == "" {
		return fmt.Sprintf("tokenizer %q: no two downloads of %s came the same (%d reads, sha256 %s), and nothing published with it says which is right (no %s, no sha256 in %s), so none was saved or used: %s",
			e.Name, Key(e.Name), e.Reads, strings.Join(got, ", "), SumsKey(e.Name), ReportKey(e.Name), fix)
	}
	return fmt.Sprintf("tokenizer %q: no download of %s matched what was published with it (%d reads, sha256 %s; published %s in %s), so none was saved or used: %s (if 'sha256sum' of the object in the bucket is not the published sha256 either, the bucket's copy is not the published one: put that back)",
		e.Name, Key(e.Name), e.Reads, strings.Join(got, ", "), e.Want, e.From, fix)
}

// download reads name's tokenizer.json from object storage (nil, nil when
// it has none) and returns it only once it matches the SHA-256 published
// with it, reading it again while it does not. A tokenizer published with
// no SHA-256 (put there by hand, or published by an earlier kiln and never
// reported) is taken once two reads agree, or one agrees with this
// machine's copy local: a change made on the way is seldom made twice the
// same, though one that is (a proxy that alters the same byte every time)
// passes such a check, as nothing without a published hash could tell it.
func (c *Catalog) download(ctx context.Context, name string, local []byte) ([]byte, error) {
	var sums []string // of each read, where a tokenizer.json can be 30 MB
	var last []byte
	var want, from string
	for range downloadReads {
		var err error
		// Read again with each try: the published hash can be changed on
		// its way as well.
		if want, from, err = c.published(ctx, name); err != nil {
			return nil, err
		}
		data, err := c.get(ctx, name)
		if err != nil || data == nil {
			return nil, err
		}
		s := sha(data)
		switch {
		case want != "" && s == want:
			return data, nil
		case want == "" && (local != nil && bytes.Equal(data, local) || slices.Contains(sums, s)):
			return data, nil
		}
		sums, last = append(sums, s), data
	}
	e := &DownloadError{Name: name, Want: want, From: from, Reads: len(sums), last: last}
	for _, s := range sums {
		if !slices.Contains(e.Got, s) {
			e.Got = append(e.Got, s)
		}
	}
	return nil, e
}

// get reads name's tokenizer.json from object storage as it comes; nil,
// nil when there is none.
func (c *Catalog) get(ctx context.Context, name string) ([]byte, error) {
	r, err := c.Objects.Get(ctx, Key(name))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get tokenizer %s: %w", Key(name), err)
	}
	defer r.Close()
	data, err := tokenizer.ReadAll(r, "object storage "+Key(name))
	if err != nil {
		return nil, fmt.Errorf("tokenizer %s: %w", name, err)
	}
	return data, nil
}

// maxSumsBytes bounds the read of a SumsFile or a report.json, both a few
// KiB at most: a larger object is not one kiln wrote.
const maxSumsBytes = 1 << 20

// published returns the SHA-256 published with tokenizer name and the
// object that says it: its SumsFile, which Publish writes before the
// tokenizer.json, else its report.json (a tokenizer published before kiln
// wrote the SumsFile). ("", "", nil) when neither has one. Either one that
// does not read as kiln writes it (changed on its way, or by hand) is
// passed over, as if absent: its tokenizer is then checked as one
// published without a hash.
func (c *Catalog) published(ctx context.Context, name string) (sum, from string, err error) {
	b, err := c.small(ctx, SumsKey(name))
	if err != nil {
		return "", "", err
	}
	if f := strings.Fields(string(b)); len(f) == 2 && f[1] == FileName && isSHA256(f[0]) {
		return f[0], SumsKey(name), nil
	}
	if b, err = c.small(ctx, ReportKey(name)); err != nil {
		return "", "", err
	}
	var r Report
	if json.Unmarshal(b, &r) == nil && r.Name == name && isSHA256(r.SHA256) {
		return r.SHA256, ReportKey(name), nil
	}
	return "", "", nil
}

// small reads key whole, up to maxSumsBytes; nil, nil when it is absent.
func (c *Catalog) small(ctx context.Context, key string) ([]byte, error) {
	r, err := c.Objects.Get(ctx, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, maxSumsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if len(b) > maxSumsBytes {
		return nil, nil
	}
	return b, nil
}

// isSHA256 is true for a SHA-256 as sha writes it: 64 lower-case hex
// digits.
func isSHA256(s string) bool {
	if len(s) != 64 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// localServes says whether this machine's copy of a tokenizer, local,
// stands in for object storage's when fetch failed with err: while object
// storage does not answer (the copy came from there or was published from
// here, and a published tokenizer's bytes never change), and when its
// downloads never matched the published SHA-256 but this copy does.
func localServes(err error, local []byte) bool {
	if local == nil {
		return false
	}
	var dl *DownloadError
	return store.Unreachable(err) || errors.As(err, &dl) && dl.Want != "" && sha(local) == dl.Want
}
