package ingest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// A bucket that refuses anonymous readers fails the file once, as the
// user's to fix (a retry of the shard meets the same refusal), naming the
// keys to set; it does not skip every blob as missing. With keys, the same
// bucket serves the blobs.
func TestSoftwareHeritageRefusalIsTheUsersToFix(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	fake.Private = true
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

// Requests signed for another region than the bucket's (AWS_REGION set for
// the machine's own region) are refused with 400 AuthorizationHeaderMalformed
// for every blob: that fails the file once as the user's to fix, naming
// AWS_REGION and the bucket's region, where it was retried as an unexpected
// answer with nothing to say what to change.
func TestSoftwareHeritageWrongRegionNamesAWSRegion(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	fake.Region = "us-east-1"
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
