package ingest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/tokens"
)

// A bucket that refuses anonymous readers fails the file once, as the
// user's to fix (a retry of the shard meets the same refusal), naming the
// keys to set; it does not skip every blob as missing. With keys, the same
// bucket serves the blobs.
func TestSoftwareHeritageRefusalIsTheUsersToFix(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	fake.SetPrivate(true)
	var rows []blobRow
	for i := range 50 {
		fake.Add(blobID(i), []byte(fmt.Sprintf("print(%d)\n", i)))
		rows = append(rows, blobRow{BlobID: blobID(i), SrcEncoding: "UTF-8"})
	}
	path := filepath.Join(t.TempDir(), "ids.parquet")
	writeParquet(t, path, rows, 16)
	cols := Columns{Blob: "blob_id", Encoding: "src_encoding"}

	docs, skips, err := readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: fake.URL(), InFlight: 8}, Columns: cols})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("anonymous read of a private bucket: %d documents, skips %v, error %v; want an error marked bad input", len(docs), skips, err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "AWS_ACCESS_KEY_ID") || !strings.Contains(msg, "AccessDenied") || strings.Contains(msg, "\n") {
		t.Fatalf("the refusal says %q; want one line naming AccessDenied and AWS_ACCESS_KEY_ID", msg)
	}
	if len(docs) != 0 || skips[SkipMissingBlob] != 0 {
		t.Fatalf("a refused bucket gave %d documents and skips %v", len(docs), skips)
	}

	swh := &SWH{Endpoint: fake.URL(), InFlight: 8, AccessKey: "AKIDEXAMPLE", SecretKey: "secret"}
	docs, skips, err = readAll(t, path, OpenOptions{SWH: swh, Columns: cols})
	if err != nil || len(docs) != len(rows) {
		t.Fatalf("signed reads: %d documents of %d, skips %v, error %v", len(docs), len(rows), skips, err)
	}
}

// An endpoint that names no bucket (a mirror's URL mistyped) answers every
// blob 404 NoSuchBucket: that fails the file as the user's to fix, naming
// KILN_SWH_ENDPOINT, where every blob was skipped as missing from the
// archive and the file recorded as empty, its content lost to the store.
func TestSoftwareHeritageWrongBucketIsNotMissingBlobs(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	var rows []blobRow
	for i := range 20 {
		fake.Add(blobID(i), []byte(fmt.Sprintf("print(%d)\n", i)))
		rows = append(rows, blobRow{BlobID: blobID(i), SrcEncoding: "UTF-8"})
	}
	path := filepath.Join(t.TempDir(), "ids.parquet")
	writeParquet(t, path, rows, 8)
	cols := Columns{Blob: "blob_id", Encoding: "src_encoding"}

	docs, skips, err := readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: fake.URL() + "/softwareheritage-mirror", InFlight: 4}, Columns: cols})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("an endpoint with no such bucket: %d documents, skips %v, error %v; want an error marked bad input", len(docs), skips, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "KILN_SWH_ENDPOINT") || !strings.Contains(msg, "NoSuchBucket") {
		t.Fatalf("an endpoint with no such bucket says %q; want it to name NoSuchBucket and KILN_SWH_ENDPOINT", msg)
	}
	if skips[SkipMissingBlob] != 0 {
		t.Fatalf("an endpoint with no such bucket counted %d blobs as missing", skips[SkipMissingBlob])
	}

	docs, skips, err = readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: fake.URL(), InFlight: 4}, Columns: cols})
	if err != nil || len(docs) != len(rows) {
		t.Fatalf("the right endpoint: %d documents of %d, skips %v, error %v", len(docs), len(rows), skips, err)
	}
}

// An endpoint nothing answers at fails the file after its retries,
// saying that it is not reached and what to check, where it named the
// connection's error alone.
func TestSoftwareHeritageNotReachedSaysWhatToCheck(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "http://" + l.Addr().String()
	l.Close() // nothing listens there now: every request is refused
	path := filepath.Join(t.TempDir(), "ids.parquet")
	writeParquet(t, path, []blobRow{{BlobID: blobID(1), SrcEncoding: "UTF-8"}}, 8)
	_, _, err = readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: endpoint, InFlight: 1, MaxRetries: 1}, Columns: Columns{Blob: "blob_id", Encoding: "src_encoding"}})
	if err == nil || !strings.Contains(err.Error(), endpoint+" is not reached from here; check this machine's network and proxy, or KILN_SWH_ENDPOINT") {
		t.Fatalf("an endpoint nothing answers at: %v; want it said not reached, naming KILN_SWH_ENDPOINT", err)
	}
}

// Requests signed for another region than the bucket's (AWS_REGION set for
// the machine's own region) are refused with 400 AuthorizationHeaderMalformed
// for every blob: that fails the file once as the user's to fix, naming
// AWS_REGION and the bucket's region, where it was retried as an unexpected
// answer with nothing to say what to change.
func TestSoftwareHeritageWrongRegionNamesAWSRegion(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	fake.SetRegion("us-east-1")
	fake.Add(blobID(1), []byte("print(1)\n"))
	path := filepath.Join(t.TempDir(), "ids.jsonl")
	if err := os.WriteFile(path, []byte(`{"blob_id":"`+blobID(1)+`"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cols := Columns{Blob: "blob_id"}
	swh := &SWH{Endpoint: fake.URL(), AccessKey: "AKIDEXAMPLE", SecretKey: "secret", Region: "eu-west-1"}
	_, _, err := readAll(t, path, OpenOptions{SWH: swh, Columns: cols})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("requests signed for another region: %v; want an error marked bad input", err)
	}
	for _, want := range []string{"AWS_REGION", "eu-west-1", "us-east-1"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("requests signed for another region: %q; want it to name %q", err, want)
		}
	}
	swh.Region = ""
	docs, _, err := readAll(t, path, OpenOptions{SWH: swh, Columns: cols})
	if err != nil || len(docs) != 1 {
		t.Fatalf("requests signed for the bucket's region: %d documents, %v", len(docs), err)
	}
}

// A blob past MaxBlobBytes even gzipped (incompressible content) is
// skipped as too large, as one that is past it once decompressed is: it
// was read only up to the bound, and that cut gzip stream is no sign of a
// corrupt file.
func TestSoftwareHeritageBlobTooLargeGzippedIsTooLarge(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	big := make([]byte, MaxBlobBytes+1<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(r.Uint32())
	}
	fake.Add(blobID(0), big)
	fake.Add(blobID(1), []byte("print(1)\n"))
	rows := []blobRow{{BlobID: blobID(0), SrcEncoding: "UTF-8"}, {BlobID: blobID(1), SrcEncoding: "UTF-8"}}
	path := filepath.Join(t.TempDir(), "ids.parquet")
	writeParquet(t, path, rows, 16)
	docs, skips, err := readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: fake.URL(), InFlight: 2},
		Columns: Columns{Blob: "blob_id", Encoding: "src_encoding"}})
	if err != nil || len(docs) != 1 || skips[SkipTooLarge] != 1 || skips[SkipCorruptFile] != 0 {
		t.Fatalf("%d documents, skips %v, error %v; want the small blob, and the large one skipped as %s", len(docs), skips, err, SkipTooLarge)
	}
}

// A mirror's address with a wrong path (a web server that answers every
// key with a bare 404) fails the file as the user's to fix, naming
// KILN_SWH_ENDPOINT: counted as missing blobs, each file was recorded as
// skipped whole, and kept out of the store once the address was fixed.
// The same ingest against the right address then appends every file. A
// mirror that lacks some of a file's blobs still skips those alone.
func TestAMirrorThatAnswersEveryBlobWithABare404IsNotAnEmptyFile(t *testing.T) {
	dir := t.TempDir()
	fake := hubtest.NewSWH()
	defer fake.Close()
	h := hubtest.New()
	defer h.Close()
	for f := range 3 {
		var rows []blobRow
		for i := range 10 {
			fake.Add(blobID(f*10+i), []byte(fmt.Sprintf("print(%d)\n", f*10+i)))
			rows = append(rows, blobRow{BlobID: blobID(f*10 + i), SrcEncoding: "UTF-8"})
		}
		p := filepath.Join(dir, fmt.Sprintf("ids-%d.parquet", f))
		writeParquet(t, p, rows, 5)
		b, _ := os.ReadFile(p)
		h.Add("owner/ids", fmt.Sprintf("data/ids-%d.parquet", f), b, true)
	}
	// The mirror: a web server that serves the archive's blobs but those
	// of files 1 and 2 of ids-0, and answers any other path with a bare 404.
	backend, _ := url.Parse(fake.URL())
	proxy := httputil.NewSingleHostReverseProxy(backend)
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, "/mirror")
		if !ok || strings.Contains(rest, blobID(1)) || strings.Contains(rest, blobID(2)) {
			http.Error(w, "<html><body>Not Found</body></html>", http.StatusNotFound)
			return
		}
		r.URL.Path = rest
		proxy.ServeHTTP(w, r)
	}))
	defer mirror.Close()
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	opt := DirectOptions{Preset: Preset{Name: "ids", Repo: "owner/ids", Revision: "main", Include: []string{"data/*.parquet"},
		Columns: Columns{Blob: "blob_id", Encoding: "src_encoding"}}, Hub: hc, Tokenizer: testTokenizer(t), TokenizerName: "test",
		StoreDir: filepath.Join(dir, "store"), DataDir: filepath.Join(dir, "data"), SWH: &SWH{Endpoint: mirror.URL + "/wrong", InFlight: 4}}
	ctx := context.Background()
	_, err = Direct(ctx, opt)
	var bad interface{ BadInput() bool }
	if !errors.As(err, &bad) || !bad.BadInput() || !strings.Contains(err.Error(), "KILN_SWH_ENDPOINT") || !strings.Contains(err.Error(), "bare 404") {
		t.Fatalf("an ingest through a mirror's wrong path: %v; want an error of the user's naming KILN_SWH_ENDPOINT", err)
	}
	if m, err := tokens.ReadManifest(opt.StoreDir); err == nil && (len(m.Skipped) > 0 || len(m.Shards) > 0) {
		t.Fatalf("the store records %d shards and skipped files %+v after the mirror's wrong path; want none", len(m.Shards), m.Skipped)
	}
	opt.SWH = &SWH{Endpoint: mirror.URL + "/mirror", InFlight: 4}
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Appended != 3 || rep.SkippedRecords[SkipMissingBlob] != 2 {
		t.Fatalf("the ingest through the mirror's right path: %+v, %v; want 3 files appended and the 2 blobs it lacks skipped", rep, err)
	}
}
