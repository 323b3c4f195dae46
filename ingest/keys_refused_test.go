package ingest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
)

// An append that meets object storage refusing the worker's keys (rotated
// on a versitygw, which answers the stat of the shard with a bare 404) says
// so, which the worker waits out using no retry: it is not archived as its
// shard gone, which would leave the store without the file for good. The
// store's status, read by the plan, is not taken for absent either.
func TestAnAppendMeetingRefusedKeysIsNotAShardGone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.S3(t)
	objects := versityObjects(t, srv)
	tok := testTokenizer(t)
	eos, _ := tok.EOS()
	p := &Pipeline{Objects: objects, StoresDir: t.TempDir()}
	b := tokens.Encode(nil, tokens.Uint16, append(tok.Encode("func main() {}"), eos))
	key := ShardObject("code", "owner/corpus/data/a.parquet")
	if err := objects.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	job := AppendJob{Store: "code", ShardID: "owner/corpus/data/a.parquet", Object: key, Source: "data/a.parquet", Documents: 1, Tokens: int64(len(b) / 2),
		Tokenizer: tokens.Tokenizer{Name: "t", SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}}

	restartWithKeys(t, srv, "otheraccess", "othersecret0123456789")
	_, err := p.Append(ctx, job, nil)
	var missing *MissingShardError
	if errors.As(err, &missing) || store.KeysRefused(err) != "XAdminUserNotFound" {
		t.Fatalf("an append whose store refuses the keys: %v; want the refusal of the keys, not the shard gone", err)
	}
	if st, err := p.Status(ctx, "code"); store.KeysRefused(err) != "XAdminUserNotFound" {
		t.Errorf("the status of a store while the keys are refused: %+v, %v; want the refusal, not a store never appended to", st, err)
	}
	if objectBytes(t, versityObjectsWithKeys(t, srv, "otheraccess", "othersecret0123456789"), key) == nil {
		t.Error("the shard is gone from object storage after the refused append")
	}
}

// versityObjectsWithKeys is the bucket kiln of srv, reached with the keys
// access and secret (those of restartWithKeys).
func versityObjectsWithKeys(t *testing.T, srv *testsvc.S3Server, access, secret string) store.Store {
	t.Helper()
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: access, SecretKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	return objects
}

// restartWithKeys stops srv and starts versitygw again on its port and its
// directory, taking only the keys access and secret: a rotation of the
// server's keys. A store made before it keeps its keys and what it learnt
// of the bucket (its region, asked once), so its next requests go to the
// server as they are, signed with an access key the server does not know.
func restartWithKeys(t *testing.T, srv *testsvc.S3Server, access, secret string) {
	t.Helper()
	srv.Stop()
	srv.StartWithKeys(access, secret)
}
