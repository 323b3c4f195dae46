// Package tokens is kiln's token store: a flat file of token ids with a
// manifest, written by one appender and read through mmap by the trainer.
//
// # Format
//
// A store is a directory holding
//
//	tokens.bin     little-endian ids, uint16 (uint32 when the vocabulary
//	               exceeds 65536), every document ended by the EOS id
//	manifest.json  format and version, dtype, the tokenizer (name, sha256,
//	               vocab_size, eos_id), the committed token and document
//	               counts, the appended shards in order (id, source,
//	               revision, sha256 of the shard's bytes, documents, tokens,
//	               offset, and for a shard that holds part of its input
//	               the part: its first record and the one after its last)
//	               and the skipped inputs with their reasons
//	lock           the appender's flock, holding its pid
//
// Only the first Manifest.Tokens ids of tokens.bin are committed; bytes past
// them are the remains of an interrupted append and are never read.
//
// # Writing
//
// OpenAppender locks a store (creating it for a tokenizer if absent) and
// Appender.Append adds one shard's ids under a shard id, exactly once: an id
// already in the manifest is a no-op reported as AppendResult.Duplicate, so
// a queue may retry an append whose process was killed at any point.
// Appender.Skip records an input that was left out and why.
//
// An input may go in in parts (ShardInfo.Part): an ingest that reaches its
// limit appends the leading documents of an input that fit, and a later
// one the rest. The parts are recorded under the input's id, end to end
// from its first record, each appended exactly once under its id and first
// record; a part that would take records again or pass some over is
// refused. A manifest that records a part is version 2, which a reader of
// version 1 would misread as the whole input; one without is version 1.
//
//	a, err := tokens.OpenAppender(ctx, dir, tokens.Tokenizer{Name: "kiln-16k", SHA256: sum, VocabSize: 16384, EOS: 0}, log)
//	res, err := a.Append(ctx, tokens.ShardInfo{ID: "the-stack-v2/000123", Source: url, Revision: commit}, shardReader)
//	err = a.Close()
//
// # Reading
//
// Open maps the committed tokens. Store.Window copies window i, the
// seqLen+1 tokens [i*(seqLen+1), (i+1)*(seqLen+1)), into an []int32: the
// first seqLen are a sequence's inputs and the last seqLen its targets.
// Windows are disjoint. Every id read is checked against the vocabulary.
//
// # Sampling
//
// NewSampler mixes several stores by weight. Each store's training windows
// are visited in a seeded pseudo-random order, without replacement, an
// epoch at a time; the order is a bijection on the window indices computed
// on the fly (a Feistel network with cycle walking), so it costs O(1)
// memory however large the store. Stores take turns by a largest-deficit
// rule: after k windows, store i has supplied within one window of w_i*k.
// Sampler.Cursor is a few integers per store that, passed back to
// NewSampler, resumes the sequence exactly.
//
//	s, err := tokens.NewSampler([]tokens.Source{{Store: code, Weight: 0.7}, {Store: web, Weight: 0.3}},
//		tokens.Config{SeqLen: 1024, Seed: seed}, resumed) // resumed: nil, or a saved *Cursor
//	buf := make([]int32, s.SeqLen()+1)
//	_, _, err = s.Next(ctx, buf) // inputs buf[:1024], targets buf[1:]
//	state.Cursor = s.Cursor()    // saved with the checkpoint
//
// A run on several devices draws the same stream in rounds: with Ranks
// devices and micro-batches of n windows, a round is Ranks*n windows and
// Sampler.NextShare gives rank r windows r*n to r*n+n-1 of it, passing the
// others over unread. Every rank's sampler ends the round at the cursor one
// sampler reaches drawing the round with Next, so the checkpoint's cursor
// is the run's and a run resumes on any number of devices with the same
// windows in the same order.
//
//	share, err := s.NextShare(ctx, buf[:n*(s.SeqLen()+1)], tokens.Share{Rank: r, Ranks: ranks})
//
// A store opened once keeps its length for the life of the Store; a run
// sees tokens appended since it opened its stores after it reopens them
// (on resume), from the next epoch of that store on.
//
// # Held-out evaluation split
//
// Window i of a store is held out for evaluation when a fixed hash of i
// (independent of the seed) falls in 1 of every HoldOut values. The sampler
// never returns a held-out window for training; NewEvalSet walks them in
// index order. Because the choice depends only on the window index, the
// split stays the same when a store grows or a run changes its seed.
package tokens
