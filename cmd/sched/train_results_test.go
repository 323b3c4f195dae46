package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// sched results --tensorboard into the directory of an earlier download
// leaves it as object storage holds the run's event files now: a file
// removed there since (its steps trained again after a resume from an
// older checkpoint, and in another file) goes here too, where it stayed
// and TensorBoard showed those steps twice. Other files are left alone.
func TestResultsTensorBoardDropsAFileRemovedSince(t *testing.T) {
	t.Parallel()
	s3 := testsvc.S3(t)
	env := []string{"KILN_DATA_DIR=" + t.TempDir(), "KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey, "KILN_S3_SECRET_KEY=" + s3.SecretKey}
	st, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	prefix := "results/pilot/tensorboard/"
	names := []string{"events.out.tfevents.1.gpu.step0", "events.out.tfevents.2.gpu.step40", "events.out.tfevents.3.gpu.step20"}
	for _, name := range names {
		if err := st.Put(ctx, prefix+name, strings.NewReader(name), int64(len(name))); err != nil {
			t.Fatal(err)
		}
	}
	tb := t.TempDir()
	if out, errOut, code := sched(t, env, "results", "pilot", "--tensorboard", tb); code != 0 {
		t.Fatalf("first download: exit %d\n%s%s", code, out, errOut)
	}
	mine := filepath.Join(tb, "pilot", "notes.txt")
	if err := os.WriteFile(mine, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := st.Delete(ctx, prefix+names[1]); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := sched(t, env, "results", "pilot", "--tensorboard", tb); code != 0 {
		t.Fatalf("second download: exit %d\n%s%s", code, out, errOut)
	}
	entries, err := os.ReadDir(filepath.Join(tb, "pilot"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if want := []string{names[0], names[2], "notes.txt"}; !slices.Equal(got, want) {
		t.Errorf("%s holds %v; want %v", filepath.Join(tb, "pilot"), got, want)
	}
}
