package tokens

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"testing"
)

func TestPermutationIsABijection(t *testing.T) {
	for _, n := range []uint64{1, 2, 3, 4, 5, 7, 8, 100, 255, 256, 257, 1000, 4097, 65537, 300_001} {
		for seed := uint64(0); seed < 3; seed++ {
			p := newPermutation(n, seed)
			seen := make([]bool, n)
			for i := uint64(0); i < n; i++ {
				v := p.at(i)
				if v >= n {
					t.Fatalf("n=%d seed=%d: at(%d) = %d, outside [0, n)", n, seed, i, v)
				}
				if seen[v] {
					t.Fatalf("n=%d seed=%d: %d is the image of two indices", n, seed, v)
				}
				seen[v] = true
			}
		}
	}
}

func TestPermutationShuffles(t *testing.T) {
	const n = 10_000
	a, b := newPermutation(n, 1), newPermutation(n, 2)
	fixed, same, ascending := 0, 0, 0
	for i := uint64(0); i < n; i++ {
		if a.at(i) == i {
			fixed++
		}
		if a.at(i) == b.at(i) {
			same++
		}
		if i > 0 && a.at(i) > a.at(i-1) {
			ascending++
		}
	}
	// A random permutation has about 1 fixed point, agrees with another in
	// about 1 place, and rises at about half its steps.
	if fixed > 10 || same > 10 || ascending < n*45/100 || ascending > n*55/100 {
		t.Fatalf("seed 1 vs 2 over %d: %d fixed points, %d agreements, %d rises: not shuffled", n, fixed, same, ascending)
	}
}

// rampStore is a store whose token p is p % 997 + 1 (an EOS every 997), so
// a window's first id identifies it.
func rampStore(t *testing.T, n int) *Store {
	t.Helper()
	ids := make([]uint32, n)
	for p := range ids {
		ids[p] = uint32(p%997 + 1)
	}
	ids[n-1] = 0
	s, err := Open(newStore(t, testTok, ids))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

type draw struct {
	store  int
	window int64
	first  int32
}

func drawN(t *testing.T, s *Sampler, n int) []draw {
	t.Helper()
	dst := make([]int32, s.SeqLen()+1)
	out := make([]draw, n)
	for k := range out {
		i, w, err := s.Next(context.Background(), dst)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = draw{i, w, dst[0]}
	}
	return out
}

func threeStores(t *testing.T) []Source {
	return []Source{
		{Store: rampStore(t, 50_000), Weight: 0.7},
		{Store: rampStore(t, 20_000), Weight: 0.2},
		{Store: rampStore(t, 9_000), Weight: 0.1},
	}
}

func TestSamplerIsDeterministicAndResumesExactly(t *testing.T) {
	src := threeStores(t)
	cfg := Config{SeqLen: 15, Seed: 42, HoldOut: 50}
	a, err := NewSampler(src, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 2,000 draws run store 2 (562 windows) through several epochs.
	whole := drawN(t, a, 2000)

	b, _ := NewSampler(src, cfg, nil)
	if got := drawN(t, b, 2000); !slices.Equal(got, whole) {
		t.Fatal("two samplers with one seed drew different windows")
	}

	c, _ := NewSampler(src, cfg, nil)
	head := drawN(t, c, 777)
	saved, err := json.Marshal(c.Cursor())
	if err != nil {
		t.Fatal(err)
	}
	var cur Cursor
	if err := json.Unmarshal(saved, &cur); err != nil {
		t.Fatal(err)
	}
	d, err := NewSampler(src, cfg, &cur)
	if err != nil {
		t.Fatalf("resume: %v", err)
	}
	tail := drawN(t, d, 2000-777)
	if !slices.Equal(append(head, tail...), whole) {
		t.Fatal("a resumed sampler drew different windows from the uninterrupted one")
	}

	other, _ := NewSampler(src, Config{SeqLen: 15, Seed: 43, HoldOut: 50}, nil)
	if slices.Equal(drawN(t, other, 200), whole[:200]) {
		t.Fatal("seeds 42 and 43 drew the same windows")
	}
}

func TestSamplerCoversEachEpochWithoutReplacementAndHoldsOut(t *testing.T) {
	st := rampStore(t, 40_000)
	cfg := Config{SeqLen: 9, Seed: 7, HoldOut: 20}
	n := st.Windows(cfg.SeqLen) // 4000
	var train []int64
	for w := int64(0); w < n; w++ {
		if !heldOut(uint64(w), cfg.HoldOut) {
			train = append(train, w)
		}
	}
	if h := n - int64(len(train)); h < n/40 || h > n/10 {
		t.Fatalf("%d of %d windows held out with hold_out 20", h, n)
	}
	s, err := NewSampler([]Source{{Store: st, Weight: 1}}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for epoch := 0; epoch < 2; epoch++ {
		got := drawN(t, s, len(train))
		seen := map[int64]bool{}
		for _, d := range got {
			if heldOut(uint64(d.window), cfg.HoldOut) {
				t.Fatalf("epoch %d: held-out window %d was drawn for training", epoch, d.window)
			}
			if seen[d.window] {
				t.Fatalf("epoch %d: window %d drawn twice", epoch, d.window)
			}
			seen[d.window] = true
			if want := int32(d.window*10%997 + 1); d.first != want {
				t.Fatalf("window %d starts with %d, want %d", d.window, d.first, want)
			}
		}
		if len(seen) != len(train) {
			t.Fatalf("epoch %d drew %d distinct windows, want %d", epoch, len(seen), len(train))
		}
	}
	if c := s.Cursor(); c.Stores[0].Epoch != 1 {
		t.Fatalf("after two epochs the cursor is in epoch %d (position %d of %d)", c.Stores[0].Epoch, c.Stores[0].Pos, c.Stores[0].Windows)
	}

	// The evaluation set is exactly the held-out windows.
	e, err := NewEvalSet(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]int32, cfg.SeqLen+1)
	var evals int64
	for {
		w, ok, err := e.Next(context.Background(), dst)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if !heldOut(uint64(w), cfg.HoldOut) {
			t.Fatalf("evaluation window %d is a training window", w)
		}
		evals++
	}
	if evals != n-int64(len(train)) {
		t.Fatalf("evaluation set has %d windows, want %d", evals, n-int64(len(train)))
	}
	e.Reset()
	first, ok, _ := e.Next(context.Background(), dst)
	if !ok || !heldOut(uint64(first), cfg.HoldOut) {
		t.Fatal("Reset did not rewind the evaluation set")
	}
}

func TestSamplerRespectsWeights(t *testing.T) {
	src := threeStores(t)
	s, err := NewSampler(src, Config{SeqLen: 15, Seed: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]int32, 16)
	var taken [3]float64
	weights := []float64{0.7, 0.2, 0.1}
	for k := 1; k <= 10_000; k++ {
		i, _, err := s.Next(context.Background(), dst)
		if err != nil {
			t.Fatal(err)
		}
		taken[i]++
		for j, w := range weights {
			if d := math.Abs(taken[j] - w*float64(k)); d > 1+1e-9 {
				t.Fatalf("after %d draws store %d supplied %v windows, %v from its share %v", k, j, taken[j], d, w*float64(k))
			}
		}
	}
}

func TestSamplerBadInput(t *testing.T) {
	st := rampStore(t, 1000)
	cfg := Config{SeqLen: 15, Seed: 1}

	_, err := NewSampler([]Source{{Store: st, Weight: 1}}, Config{SeqLen: 1000, Seed: 1}, nil)
	wantInputError(t, err, st.Dir(), "holds 1000 tokens", "seq_len+1 = 1001", "lower seq_len")

	_, err = NewSampler([]Source{{Store: st, Weight: 0}}, cfg, nil)
	wantInputError(t, err, st.Dir(), "weight 0")
	_, err = NewSampler([]Source{{Store: st, Weight: math.NaN()}}, cfg, nil)
	wantInputError(t, err, "weight NaN")
	_, err = NewSampler(nil, cfg, nil)
	wantInputError(t, err, "no token store")
	_, err = NewSampler([]Source{{Store: st, Weight: 1}}, Config{SeqLen: 0}, nil)
	wantInputError(t, err, "seq_len")

	other := testTok
	other.Name, other.SHA256 = "other", "0123"
	st2, err := Open(newStore(t, other, shardIDs(3, 1000, 1000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	_, err = NewSampler([]Source{{Store: st, Weight: 1}, {Store: st2, Weight: 1}}, cfg, nil)
	wantInputError(t, err, st.Dir(), st2.Dir(), testTok.SHA256, "0123", "one tokenizer")

	s, _ := NewSampler([]Source{{Store: st, Weight: 1}}, cfg, nil)
	drawN(t, s, 3)
	cur := s.Cursor()
	_, err = NewSampler([]Source{{Store: st, Weight: 1}}, Config{SeqLen: 31, Seed: 1}, &cur)
	wantInputError(t, err, "seq_len 15", "resume with the run's own settings")
	_, err = NewSampler([]Source{{Store: st, Weight: 1}, {Store: st, Weight: 1}}, cfg, &cur)
	wantInputError(t, err, "covers 1 stores, but 2")
	good := cur.Stores[0]
	cur.Stores[0].Windows = 1000
	_, err = NewSampler([]Source{{Store: st, Weight: 1}}, cfg, &cur)
	wantInputError(t, err, st.Dir(), "holds 62 windows", "records 1000")
	// A position past the store's windows is no run's: a damaged state,
	// not another store.
	cur.Stores[0] = good
	cur.Stores[0].Pos = 1 << 50
	_, err = NewSampler([]Source{{Store: st, Weight: 1}}, cfg, &cur)
	wantInputError(t, err, st.Dir(), "not one a run writes", "set that checkpoint aside (rename its directory to step-NNNNNNN.damaged) and resume")
	// A cursor of zeros (null in the file) is no run's either: it does
	// not blame the run's settings, which are right.
	_, err = NewSampler([]Source{{Store: st, Weight: 1}}, cfg, &Cursor{})
	wantInputError(t, err, "the run's cursor is not one a run writes (seq_len 0, 0 stores)", "set that checkpoint aside")
}

func TestSamplerStopsAtABadID(t *testing.T) {
	// Position 500011 lies between the spans Open samples.
	dir := newStore(t, testTok, shardIDs(1, 1_000_000, 1000, 0))
	corruptID(t, dir, 500_011, 2000)
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s, err := NewSampler([]Source{{Store: st, Weight: 1}}, Config{SeqLen: 99, Seed: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]int32, 100)
	for k := 0; k < 20_000; k++ {
		before := s.Cursor()
		_, _, err := s.Next(context.Background(), dst)
		if err == nil {
			continue
		}
		wantInputError(t, err, "token 500011 is id 2000")
		after := s.Cursor()
		if after.Draws != before.Draws || after.Stores[0] != before.Stores[0] {
			t.Fatalf("a failed draw moved the cursor from %+v to %+v", before, after)
		}
		return
	}
	t.Fatal("no draw read the window holding id 2000")
}

func TestSamplerHonoursCancellation(t *testing.T) {
	s, err := NewSampler([]Source{{Store: rampStore(t, 1000), Weight: 1}}, Config{SeqLen: 15}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := s.Next(ctx, make([]int32, 16)); err != context.Canceled {
		t.Fatalf("Next with a cancelled context = %v", err)
	}
}

// FirstHeldOut is where a store's held-out windows begin: a store of that
// many windows has none to evaluate on, one more window has one.
func TestFirstHeldOutIsWhereEvaluationBegins(t *testing.T) {
	for _, holdOut := range []int{0, 10, 1000} {
		first := FirstHeldOut(holdOut)
		for _, n := range []int64{first, first + 1} {
			st := rampStore(t, int(n)*5)
			ev, err := NewEvalSet(st, Config{SeqLen: 4, HoldOut: holdOut})
			if err != nil {
				t.Fatal(err)
			}
			w, ok, err := ev.Next(context.Background(), make([]int32, 5))
			if err != nil || ok != (n > first) || ok && w != first {
				t.Errorf("hold_out %d, %d windows: first held-out window %d, %v, %v; want one (window %d) only past %d windows", holdOut, n, w, ok, err, first, first)
			}
		}
	}
}
