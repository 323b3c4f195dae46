// Package store is kiln's object store: one interface, implemented by S3
// (through minio-go) and by a local directory. Keys use the prefixes of the
// design (tokens/<dataset>/shards/, tokenizers/<name>/, checkpoints/<run>/,
// results/<run>/). A Put is atomic from a reader's point of view: a reader
// sees the old object, or none, or the whole new one, never a part.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Store is an object store.
type Store interface {
	// Put stores r's bytes at key. size is the length, or -1 when unknown
	// (streamed in bounded parts).
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens key for reading; the caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat returns key's metadata.
	Stat(ctx context.Context, key string) (Info, error)
	// List returns the objects whose keys start with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]Info, error)
	// Delete removes key; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// PutUnsigned is Put for bytes that whoever reads them verifies on its own
// (a shard token file, whose SHA-256 travels in the task that appends it):
// a store that signs what it uploads (S3 over plain http) then leaves the
// body unsigned, which saves a SHA-256 of every byte on both ends. Other
// stores just Put.
func PutUnsigned(ctx context.Context, s Store, key string, r io.Reader, size int64) error {
	if u, ok := s.(interface {
		PutUnsigned(ctx context.Context, key string, r io.Reader, size int64) error
	}); ok {
		return u.PutUnsigned(ctx, key, r, size)
	}
	return s.Put(ctx, key, r, size)
}

// Info describes one object.
type Info struct {
	Key      string
	Size     int64
	Modified time.Time
}

// ErrNotFound is returned (wrapped) by Get and Stat for a missing key.
var ErrNotFound = errors.New("object not found")

// MaxNameBytes bounds the names kiln makes one element of an object key and
// of a local path (tokenizers, token stores, runs): with the suffixes kiln
// adds to them, a longer one could pass a filesystem's 255-byte limit.
const MaxNameBytes = 100

// NameTooLong says that name, of kind what ("run", "token store"), is
// longer than MaxNameBytes, and is nil otherwise.
func NameTooLong(what, name string) error {
	if len(name) <= MaxNameBytes {
		return nil
	}
	return fmt.Errorf("%s name %.24q... is %d bytes long: use at most %d", what, name, len(name), MaxNameBytes)
}

// CheckName refuses a name, of kind what ("run", "tokenizer", "token
// store"), that would not stay one directory and one object-store path
// element, the same rule for every name a person gives kiln: letters,
// digits, '-', '_' and '.', starting with a letter or digit, at most
// MaxNameBytes. A leading dot would hide the directory (or be . or ..), and
// a leading '-' would make kiln's own hints (mkdir -p .../-x) read as an
// option.
func CheckName(what, name string) error {
	if err := NameTooLong(what, name); err != nil {
		return err
	}
	ok := name != "" && isAlnum(rune(name[0]))
	for _, r := range name {
		ok = ok && (r == '-' || r == '_' || r == '.' || isAlnum(r))
	}
	if !ok {
		return fmt.Errorf("%s name %q: use letters, digits, '-', '_' or '.', starting with a letter or digit (no slashes or spaces)", what, name)
	}
	return nil
}

func isAlnum(r rune) bool {
	return (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')
}

// CheckKey rejects keys that would escape a prefix or a directory.
func CheckKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") {
		return fmt.Errorf("object key %q: must be a non-empty relative path not ending in /", key)
	}
	for _, part := range strings.Split(key, "/") {
		if part == "" || part == "." || part == ".." {
			return fmt.Errorf("object key %q: empty, . or .. path element", key)
		}
	}
	return nil
}
