package tokens

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// A shard whose download is changed on the way (a byte flipped in transit)
// fails that append as a HashError, which is no bad input (the append
// task's next try reads the shard again) and does not call the stored
// shard damaged, whichever check the changed bytes fail first: the
// hash, an id past the vocabulary or the EOS at the end. The next read,
// unchanged, appends, streamed (Append) or read whole first (CheckShard).
func TestAShardChangedOnTheWayIsReadAgain(t *testing.T) {
	t.Parallel()
	srv := testsvc.S3(t)
	faults := srv.Faults(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: faults.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ids := shardIDs(3, 600, 1000, 0)
	ids[10] = 744 // 0x02e8: its high byte flipped makes 1000, past the vocabulary
	ids[20] = 5
	data := Encode(nil, Uint16, ids)
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	const key = "tokens/s/shards/x.tokens"
	if err := objects.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	flips := []struct {
		name string
		at   int64
	}{
		{"an id's byte", 2 * 20},
		{"an id past the vocabulary", 2*10 + 1},
		{"the last EOS", int64(len(data)) - 2},
	}
	for _, path := range []string{"streamed", "checked beforehand"} {
		for _, f := range flips {
			dir := t.TempDir()
			a := openTestAppender(t, dir, testTok)
			info := ShardInfo{ID: "x", Source: "src/x", SHA256: want}
			appendOnce := func() error {
				r, err := objects.Get(ctx, key)
				if err != nil {
					return err
				}
				defer r.Close()
				if path == "streamed" {
					_, err = a.Append(ctx, info, r)
					return err
				}
				b, err := io.ReadAll(r)
				if err != nil {
					return err
				}
				c, err := CheckShard(dir, info, testTok, b)
				if err != nil {
					return err
				}
				_, err = a.AppendChecked(ctx, c)
				return err
			}

			flipped := faults.Acted("GET /kiln/" + key)
			faults.Add(testsvc.Fault{Method: "GET", Path: key, Action: testsvc.Flip, At: f.at, Count: 1})
			err := appendOnce()
			if n := faults.Acted("GET /kiln/"+key) - flipped; n != 1 {
				t.Fatalf("%s, %s flipped: the proxy flipped %d GETs, want 1", path, f.name, n)
			}
			var he *HashError
			var bad interface{ BadInput() bool }
			if !errors.As(err, &he) || he.Want != want || he.Got == want {
				t.Fatalf("%s, %s flipped: %v; want a HashError", path, f.name, err)
			}
			if errors.As(err, &bad) && bad.BadInput() {
				t.Errorf("%s, %s flipped: %v is bad input, which no retry reads again", path, f.name, err)
			}
			msg := err.Error()
			for _, w := range []string{`"x"`, dir, want, he.Got, "next try reads it again"} {
				if !strings.Contains(msg, w) {
					t.Errorf("%s, %s flipped: %q does not name %q", path, f.name, msg, w)
				}
			}
			if strings.Contains(msg, "damaged") {
				t.Errorf("%s, %s flipped: %q calls the shard damaged", path, f.name, msg)
			}
			if st, err := os.Stat(filepath.Join(dir, ManifestFile)); err != nil || a.Manifest().Tokens != 0 {
				t.Fatalf("%s, %s flipped: the store changed: %d tokens (%v, %v)", path, f.name, a.Manifest().Tokens, st, err)
			}

			if err := appendOnce(); err != nil {
				t.Fatalf("%s, %s flipped: the next read: %v", path, f.name, err)
			}
			if got := readAll(t, dir); len(got) != len(ids) || got[10] != 744 || got[len(got)-1] != 0 {
				t.Fatalf("%s, %s flipped: the store holds %d tokens after the next read, want the shard's %d", path, f.name, len(got), len(ids))
			}
		}
	}
}

// A shard whose bytes are those it was made with keeps the refusal of the
// check it fails, bad input that no retry mends; a streamed one reads to
// its end to tell.
func TestAShardMadeWrongStaysBadInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		ids  []uint32
		want string
	}{
		{"an id past the vocabulary", []uint32{5, 1000, 7, 0, 3, 0}, "outside the vocabulary"},
		{"no EOS at the end", []uint32{5, 0, 6}, "not the EOS id"},
	} {
		data := Encode(nil, Uint16, c.ids)
		sum := sha256.Sum256(data)
		info := ShardInfo{ID: "x", SHA256: hex.EncodeToString(sum[:])}
		a := openTestAppender(t, t.TempDir(), testTok)
		_, err := a.Append(context.Background(), info, bytes.NewReader(data))
		_, cerr := CheckShard("d", info, testTok, data)
		for _, err := range []error{err, cerr} {
			var ie *InputError
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v; want bad input saying %q", c.name, err, c.want)
			}
		}
	}
}
