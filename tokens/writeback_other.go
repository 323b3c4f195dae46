//go:build !linux

package tokens

import "os"

// startWriteback is a hint that only Linux takes (sync_file_range); the
// commit's fsync makes the bytes durable everywhere.
func startWriteback(f *os.File, off, n int64) {}
