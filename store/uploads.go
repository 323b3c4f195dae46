package store

import (
	"context"
	"fmt"
	"time"

	"github.com/minio/minio-go/v7"
)

// Prefixes are the object-store prefixes kiln writes under.
var Prefixes = []string{"tokens/", "tokenizers/", "checkpoints/", "results/"}

// StaleUploadAge is how long an unfinished multipart upload must have been
// idle (no part written since it started or since its last part) before a
// worker, at its start and every StaleUploadAge after, takes it for an
// orphan, left by a killed process or by an abort that failed during an S3
// outage. Other workers share the bucket and their uploads are live: a
// writer sends a part each time it fills one (16 MiB), which for a shard
// takes seconds of tokenizing and for a checkpoint a file read, so a live
// upload is never idle for an hour, while an orphan holds its parts' bytes
// for two hours at most while a worker runs.
const StaleUploadAge = time.Hour

// Upload is an unfinished multipart upload.
type Upload struct {
	Key, ID string
	// LastActive is when the upload started or its last part came in,
	// whichever is later, by the server's clock.
	LastActive time.Time
	Parts      int
}

// AbortStaleUploads aborts the unfinished multipart uploads under kiln's
// prefixes that have been idle since before cutoff, and returns them. In
// the local directory store, an unfinished put is the temporary file a
// process killed mid-put left beside its object; those idle since before
// cutoff are removed.
func AbortStaleUploads(ctx context.Context, s Store, cutoff time.Time) ([]Upload, error) {
	if l, ok := s.(*Local); ok {
		return l.removeStalePuts(ctx, cutoff)
	}
	s3, ok := s.(*S3)
	if !ok {
		return nil, nil
	}
	ctx = withStallBudget(ctx)
	var aborted []Upload
	for _, prefix := range Prefixes {
		ups, err := s3.Uploads(ctx, prefix)
		if err != nil {
			return aborted, err
		}
		for _, u := range ups {
			if !u.LastActive.Before(cutoff) {
				continue
			}
			// By id, never by key: a live upload may share the key.
			if err := s3.core().AbortMultipartUpload(ctx, s3.o.Bucket, u.Key, u.ID); err != nil {
				if minio.ToErrorResponse(err).Code == "NoSuchUpload" {
					continue // completed or aborted since it was listed
				}
				return aborted, s3.wrap("abort the stale multipart upload "+u.ID+" of", u.Key, err)
			}
			aborted = append(aborted, u)
		}
	}
	return aborted, nil
}

func (s *S3) core() minio.Core { return minio.Core{Client: s.c} }

// Uploads lists the unfinished multipart uploads under prefix, each with
// the time it was last active. A bucket that does not exist has none.
func (s *S3) Uploads(ctx context.Context, prefix string) ([]Upload, error) {
	ctx = withStallBudget(ctx)
	var out []Upload
	keyMarker, idMarker := "", ""
	for {
		res, err := s.core().ListMultipartUploads(ctx, s.o.Bucket, prefix, keyMarker, idMarker, "", 1000)
		if err != nil {
			if minio.ToErrorResponse(err).Code == "NoSuchBucket" {
				return nil, nil
			}
			return nil, s.wrap("list the unfinished uploads under", prefix+"*", err)
		}
		for _, mu := range res.Uploads {
			u := Upload{Key: mu.Key, ID: mu.UploadID, LastActive: mu.Initiated}
			if err := s.lastPart(ctx, &u); err != nil {
				return nil, err
			}
			out = append(out, u)
		}
		if !res.IsTruncated || res.NextKeyMarker == "" && res.NextUploadIDMarker == "" {
			return out, nil
		}
		keyMarker, idMarker = res.NextKeyMarker, res.NextUploadIDMarker
	}
}

// lastPart counts u's parts and moves u.LastActive to the newest one's.
func (s *S3) lastPart(ctx context.Context, u *Upload) error {
	marker := 0
	for {
		res, err := s.core().ListObjectParts(ctx, s.o.Bucket, u.Key, u.ID, marker, 1000)
		if minio.ToErrorResponse(err).Code == "NoSuchUpload" {
			return nil // completed or aborted since it was listed
		}
		if err != nil {
			return s.wrap(fmt.Sprintf("list the parts of upload %s of", u.ID), u.Key, err)
		}
		for _, p := range res.ObjectParts {
			u.Parts++
			if p.LastModified.After(u.LastActive) {
				u.LastActive = p.LastModified
			}
		}
		if !res.IsTruncated || res.NextPartNumberMarker <= marker {
			return nil
		}
		marker = res.NextPartNumberMarker
	}
}
