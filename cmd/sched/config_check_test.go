package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// sched config --check says when the bucket does not exist, naming it, the
// server and KILN_S3_BUCKET, and leaves it uncreated: a mistyped bucket
// would otherwise be created unnoticed at the first write. It is a notice,
// not a failure, as a fresh setup has no bucket until that write.
func TestConfigCheckSaysTheBucketDoesNotExist(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	env := []string{"KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0", "KILN_S3_ENDPOINT=" + srv.Endpoint,
		"KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey, "KILN_S3_BUCKET=kiln-typo"}

	out, errOut, code := sched(t, env, "config", "--check")
	want := "redis and object store reachable, but bucket kiln-typo does not exist at http://" + srv.Endpoint +
		": check KILN_S3_BUCKET (--s3-bucket); kiln creates it at the first write\n"
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("config --check with no bucket: exit %d\n%s%s\nwant exit 0 and %q", code, out, errOut, want)
	}
	if _, err := os.Stat(filepath.Join(srv.Dir, "kiln-typo")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("config --check created the bucket: %v", err)
	}

	// The first write still creates it, and then the check is plain.
	s, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln-typo", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), "results/x", strings.NewReader("x"), 1); err != nil {
		t.Fatalf("the first write: %v", err)
	}
	out, errOut, code = sched(t, env, "config", "--check")
	if code != 0 || !strings.Contains(out, "redis and object store reachable\n") || strings.Contains(out, "does not exist") {
		t.Fatalf("config --check with the bucket: exit %d\n%s%s", code, out, errOut)
	}
}

// A malformed KILN_S3_ENDPOINT and a KILN_DATA_DIR that is a file are
// refused when the configuration is read, in one line naming the setting
// as it was given and saying what a valid value is, with exit status 2:
// not as a URL parse error or a failed mkdir that names neither.
func TestConfigRefusesAMalformedEndpointAndAFileForDataDir(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	s3 := func(endpoint string) []string {
		return []string{"KILN_S3_ENDPOINT=" + endpoint, "KILN_S3_ACCESS_KEY=ak", "KILN_S3_SECRET_KEY=sk"}
	}
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{s3("garbage host:xx"), []string{"config", "--check"},
			`KILN_S3_ENDPOINT: "garbage host:xx" is not host:port (it has a space in it), e.g. minio:9000 or 127.0.0.1:9000`},
		{s3("garbage host:xx"), []string{"tokenizers"}, `KILN_S3_ENDPOINT: "garbage host:xx" is not host:port`},
		{s3("minio:9000"), []string{"config", "--s3-endpoint", "minio:xx"},
			`--s3-endpoint: "minio:xx" is not host:port (port "xx" is not a number from 1 to 65535), e.g. minio:9000`},
		{[]string{"KILN_DATA_DIR=" + file}, []string{"config", "--check"},
			"KILN_DATA_DIR: " + `"` + file + `" is a file, not a directory: point it at a directory`},
		{nil, []string{"tokenizers", "--data-dir", file},
			"--data-dir: " + `"` + file + `" is a file, not a directory: point it at a directory`},
		{[]string{"KILN_DATA_DIR=" + filepath.Join(file, "data")}, []string{"config"}, `is under a file, not a directory: point it at a directory`},
	} {
		wantRefused(t, c.env, c.want, c.args...)
	}
}
