package tokens

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// round is what one sampler drawing with Next sees of a round: the windows
// and their ids.
type round struct {
	refs []WindowRef
	ids  []int32
}

func drawRound(t *testing.T, s *Sampler, windows int) round {
	t.Helper()
	w := s.SeqLen() + 1
	r := round{ids: make([]int32, windows*w)}
	for i := 0; i < windows; i++ {
		st, win, err := s.Next(context.Background(), r.ids[i*w:(i+1)*w])
		if err != nil {
			t.Fatal(err)
		}
		r.refs = append(r.refs, WindowRef{Store: st, Window: win})
	}
	return r
}

func drawShare(t *testing.T, s *Sampler, n int, sh Share) round {
	t.Helper()
	r := round{ids: make([]int32, n*(s.SeqLen()+1))}
	refs, err := s.NextShare(context.Background(), r.ids, sh)
	if err != nil {
		t.Fatalf("share %d of %d: %v", sh.Rank, sh.Ranks, err)
	}
	r.refs = refs
	return r
}

// For every number of ranks, the ranks' shares of a round, in rank order,
// are the round one sampler draws with Next: the same windows with the same
// ids, none in two shares, and every rank ends the round at that sampler's
// cursor.
func TestSharesInRankOrderAreTheOneSamplerStream(t *testing.T) {
	src := threeStores(t)
	cfg := Config{SeqLen: 15, Seed: 9, HoldOut: 50}
	w := cfg.SeqLen + 1
	for ranks := 1; ranks <= 8; ranks++ {
		for _, n := range []int{1, 3} {
			t.Run(fmt.Sprintf("ranks=%d,n=%d", ranks, n), func(t *testing.T) {
				one, err := NewSampler(src, cfg, nil)
				if err != nil {
					t.Fatal(err)
				}
				samplers := make([]*Sampler, ranks)
				for r := range samplers {
					if samplers[r], err = NewSampler(src, cfg, nil); err != nil {
						t.Fatal(err)
					}
				}
				// 10 rounds of at most 24 windows stay inside every store's
				// first epoch, so no window may appear twice.
				seen := map[WindowRef]int{}
				for k := 0; k < 10; k++ {
					want := drawRound(t, one, ranks*n)
					for r, s := range samplers {
						got := drawShare(t, s, n, Share{Rank: r, Ranks: ranks})
						if !slices.Equal(got.refs, want.refs[r*n:(r+1)*n]) {
							t.Fatalf("round %d, rank %d: windows %v, want %v", k, r, got.refs, want.refs[r*n:(r+1)*n])
						}
						if !slices.Equal(got.ids, want.ids[r*n*w:(r+1)*n*w]) {
							t.Fatalf("round %d, rank %d: the ids differ from the one sampler's", k, r)
						}
						for _, ref := range got.refs {
							if prev, ok := seen[ref]; ok {
								t.Fatalf("round %d: window %+v is in rank %d's share and rank %d's", k, ref, r, prev)
							}
							seen[ref] = r
						}
						if c, wc := s.Cursor(), one.Cursor(); !reflect.DeepEqual(c, wc) {
							t.Fatalf("round %d, rank %d: cursor %+v, the one sampler's %+v", k, r, c, wc)
						}
					}
				}
			})
		}
	}
}

// step is one optimizer step trained on ranks devices: accumulate
// micro-batches of b windows, accumulate/ranks of them per device, drawn a
// round (one micro-batch per device) at a time. It returns the step's
// windows interleaved back into the one-device order, and the cursor every
// rank ends at.
func step(t *testing.T, samplers []*Sampler, accumulate, b int) ([]WindowRef, Cursor) {
	t.Helper()
	ranks := len(samplers)
	var out []WindowRef
	for j := 0; j < accumulate/ranks; j++ {
		for r, s := range samplers {
			out = append(out, drawShare(t, s, b, Share{Rank: r, Ranks: ranks}).refs...)
		}
	}
	cur := samplers[0].Cursor()
	for r, s := range samplers[1:] {
		if c := s.Cursor(); !reflect.DeepEqual(c, cur) {
			t.Fatalf("after a step rank %d's cursor is %+v, rank 0's %+v", r+1, c, cur)
		}
	}
	return out, cur
}

func resumeRanks(t *testing.T, src []Source, cfg Config, ranks int, saved []byte) []*Sampler {
	t.Helper()
	out := make([]*Sampler, ranks)
	for r := range out {
		var cur Cursor
		if err := json.Unmarshal(saved, &cur); err != nil {
			t.Fatal(err)
		}
		s, err := NewSampler(src, cfg, &cur)
		if err != nil {
			t.Fatal(err)
		}
		out[r] = s
	}
	return out
}

// A run checkpointed after 4 steps on 2 devices resumes on 1, 3 or 6 with
// the windows, in order, of the run that never stopped; and the one-device
// run's cursor after those steps is the 2-device run's.
func TestACursorResumesOnAnotherNumberOfDevices(t *testing.T) {
	src := threeStores(t)
	cfg := Config{SeqLen: 15, Seed: 5, HoldOut: 50}
	const accumulate, b, steps = 6, 2, 4

	one, err := NewSampler(src, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	whole := drawRound(t, one, steps*accumulate*b).refs
	afterTwo, _ := NewSampler(src, cfg, nil)
	drawRound(t, afterTwo, 2*accumulate*b)
	oneCursorAtTwo := afterTwo.Cursor()

	two := make([]*Sampler, 2)
	for r := range two {
		if two[r], err = NewSampler(src, cfg, nil); err != nil {
			t.Fatal(err)
		}
	}
	var trained []WindowRef
	var cur Cursor
	for k := 0; k < 2; k++ {
		got, c := step(t, two, accumulate, b)
		trained, cur = append(trained, got...), c
	}
	if !slices.Equal(trained, whole[:2*accumulate*b]) {
		t.Fatalf("two devices trained %v in their first two steps, one device %v", trained, whole[:2*accumulate*b])
	}
	if !reflect.DeepEqual(cur, oneCursorAtTwo) {
		t.Fatalf("the 2-device cursor after two steps is %+v, the 1-device one %+v", cur, oneCursorAtTwo)
	}
	saved, err := json.Marshal(cur)
	if err != nil {
		t.Fatal(err)
	}
	for _, ranks := range []int{1, 3, 6} {
		resumed := resumeRanks(t, src, cfg, ranks, saved)
		var rest []WindowRef
		for k := 2; k < steps; k++ {
			got, _ := step(t, resumed, accumulate, b)
			rest = append(rest, got...)
		}
		if !slices.Equal(rest, whole[2*accumulate*b:]) {
			t.Fatalf("resumed on %d devices: steps 3 and 4 trained %v, want %v", ranks, rest, whole[2*accumulate*b:])
		}
	}
}

func TestNextShareRefusesBadArguments(t *testing.T) {
	s, err := NewSampler([]Source{{Store: rampStore(t, 10_000), Weight: 1}}, Config{SeqLen: 15, Seed: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := s.Cursor()
	for _, c := range []struct {
		sh   Share
		n    int
		want string
	}{
		{Share{Rank: 2, Ranks: 2}, 16, "share 2 of 2"},
		{Share{Rank: -1, Ranks: 2}, 16, "share -1 of 2"},
		{Share{Rank: 0, Ranks: 0}, 16, "at least one rank"},
		{Share{Rank: 0, Ranks: 2}, 17, "17 ids is not a whole number of windows of seq_len+1 = 16"},
		{Share{Rank: 0, Ranks: 2}, 0, "0 ids"},
	} {
		_, err := s.NextShare(context.Background(), make([]int32, c.n), c.sh)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NextShare(%+v, %d ids) = %v, want an error mentioning %q", c.sh, c.n, err, c.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.NextShare(ctx, make([]int32, 16), Share{Rank: 0, Ranks: 2}); err != context.Canceled {
		t.Errorf("NextShare with a cancelled context = %v", err)
	}
	if after := s.Cursor(); !reflect.DeepEqual(after, before) {
		t.Errorf("refused draws moved the cursor from %+v to %+v", before, after)
	}
}

// A window that cannot be read fails only the rank whose share holds it,
// and that rank's cursor stays at the round's start; the other ranks pass
// over the window without reading it.
func TestABadWindowFailsOnlyTheRankThatReadsIt(t *testing.T) {
	// Position 500011 lies between the spans Open samples.
	dir := newStore(t, testTok, shardIDs(1, 1_000_000, 1000, 0))
	corruptID(t, dir, 500_011, 2000)
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src := []Source{{Store: st, Weight: 1}}
	cfg := Config{SeqLen: 99, Seed: 3}
	const ranks, n = 4, 2
	samplers := make([]*Sampler, ranks)
	for r := range samplers {
		if samplers[r], err = NewSampler(src, cfg, nil); err != nil {
			t.Fatal(err)
		}
	}
	for k := 0; k < 2_000; k++ {
		failed := -1
		for r, s := range samplers {
			before := s.Cursor()
			_, err := s.NextShare(context.Background(), make([]int32, n*100), Share{Rank: r, Ranks: ranks})
			if err == nil {
				continue
			}
			wantInputError(t, err, "token 500011 is id 2000")
			if after := s.Cursor(); !reflect.DeepEqual(after, before) {
				t.Fatalf("rank %d's failed round moved its cursor from %+v to %+v", r, before, after)
			}
			if failed >= 0 {
				t.Fatalf("round %d: ranks %d and %d both read the bad window", k, failed, r)
			}
			failed = r
		}
		if failed >= 0 {
			return
		}
	}
	t.Fatal("no rank read the window holding id 2000")
}
