package segment

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// newS3 starts a real versitygw and returns kiln's S3 store on it.
func newS3(t *testing.T) (store.Store, *testsvc.S3Server) {
	t.Helper()
	srv := testsvc.S3(t)
	s, err := newS3Store(srv)
	if err != nil {
		t.Fatal(err)
	}
	return s, srv
}

func newS3Store(srv *testsvc.S3Server) (store.Store, error) {
	return store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
}

// newRedis connects to a real redis-server for the segment's lease and state.
func newRedis(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testsvc.Redis(t)})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
