package trainer

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
)

func TestGlobalBatchSplitsAccumulateOverDevices(t *testing.T) {
	for devices := 1; devices <= 8; devices++ {
		for _, accumulate := range []int{devices, 2 * devices, 3 * devices, 840} {
			g, err := NewGlobalBatch(4, accumulate, devices)
			if err != nil {
				t.Fatalf("batch 4, accumulate %d, %d GPUs: %v", accumulate, devices, err)
			}
			if g.PerDevice()*devices != accumulate || g.Windows() != 4*accumulate {
				t.Fatalf("accumulate %d on %d GPUs: %d micro-batches per GPU, %d windows a step", accumulate, devices, g.PerDevice(), g.Windows())
			}
			if g.Scale() != 1/float32(accumulate) {
				t.Fatalf("accumulate %d on %d GPUs: scale %v, want 1/%d", accumulate, devices, g.Scale(), accumulate)
			}
			// Every one-device micro-batch of a step is trained once.
			seen := make([]bool, accumulate)
			for j := 0; j < g.PerDevice(); j++ {
				for r := 0; r < devices; r++ {
					i := g.MicroBatch(r, j)
					if i < 0 || i >= accumulate || seen[i] {
						t.Fatalf("accumulate %d on %d GPUs: GPU %d's micro-batch %d is the step's %d, outside it or taken twice", accumulate, devices, r, j, i)
					}
					seen[i] = true
				}
			}
		}
	}
}

func TestGlobalBatchRefusesWhatCannotSplit(t *testing.T) {
	for _, c := range []struct {
		batch, accumulate, devices int
		want                       []string
	}{
		{4, 3, 2, []string{"accumulate 3 is not a multiple of gpus 2", "set accumulate to 2 or 4", "train on 1 GPU"}},
		{4, 6, 4, []string{"accumulate 6 is not a multiple of gpus 4", "4 or 8", "1, 2 or 3 GPUs"}},
		{4, 1, 8, []string{"accumulate 1 is not a multiple of gpus 8", "set accumulate to 8,", "train on 1 GPU"}},
		{4, 4, 0, []string{"gpus must be at least 1, got 0"}},
		{0, 4, 2, []string{"batch must be at least 1, got 0"}},
		{4, 0, 2, []string{"accumulate must be at least 1, got 0"}},
	} {
		_, err := NewGlobalBatch(c.batch, c.accumulate, c.devices)
		if err == nil {
			t.Errorf("batch %d, accumulate %d, %d GPUs was accepted", c.batch, c.accumulate, c.devices)
			continue
		}
		if !isBadInput(err) || strings.Contains(err.Error(), "\n") {
			t.Errorf("batch %d, accumulate %d, %d GPUs: %v is not one line of bad input", c.batch, c.accumulate, c.devices, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("batch %d, accumulate %d, %d GPUs: %q does not say %q", c.batch, c.accumulate, c.devices, err, w)
			}
		}
	}
}

func openTestMixture(t *testing.T, entries []MixtureEntry, seq int) *Mixture {
	t.Helper()
	m, err := OpenMixture(entries, model.Presets["tiny"], seq, 11)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func testEntries(t *testing.T) []MixtureEntry {
	vocab := model.Presets["tiny"].VocabSize
	return []MixtureEntry{{Store: makeStore(t, vocab, 200_000, 1), Weight: 0.7}, {Store: makeStore(t, vocab, 100_000, 2), Weight: 0.3}}
}

// oneDevice is the micro-batches of steps optimizer steps on one device.
func oneDevice(t *testing.T, d Data, g GlobalBatch, seq, steps int) []model.Batch {
	t.Helper()
	var out []model.Batch
	for i := 0; i < steps*g.Accumulate; i++ {
		b, err := d.Next(context.Background(), g.Batch, seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// devices is the micro-batches of steps optimizer steps on g.Devices
// devices, each put back at its place in the one-device order.
func devices(t *testing.T, d Data, g GlobalBatch, seq, steps int) []model.Batch {
	t.Helper()
	out := make([]model.Batch, steps*g.Accumulate)
	for s := 0; s < steps; s++ {
		for j := 0; j < g.PerDevice(); j++ {
			round, err := g.Round(context.Background(), d, seq, tokens.Share{Rank: 0, Ranks: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(round) != g.Devices {
				t.Fatalf("a round of %d devices has %d micro-batches", g.Devices, len(round))
			}
			for r, b := range round {
				out[s*g.Accumulate+g.MicroBatch(r, j)] = b
			}
		}
	}
	return out
}

func sameBatches(t *testing.T, what string, got, want []model.Batch) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d micro-batches, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i].B != want[i].B || got[i].T != want[i].T || !slices.Equal(got[i].Inputs, want[i].Inputs) || !slices.Equal(got[i].Targets, want[i].Targets) {
			t.Fatalf("%s: micro-batch %d differs from the one-device run's", what, i)
		}
	}
}

// On 1 to 8 devices a step's micro-batches, each device's put back at its
// place, are the one-device step's: the same windows in the same order.
func TestDevicesTrainTheOneDeviceSteps(t *testing.T) {
	entries := testEntries(t)
	const seq, steps = 16, 2
	for n := 1; n <= 8; n++ {
		for _, accumulate := range []int{n, 3 * n} {
			g, err := NewGlobalBatch(2, accumulate, n)
			if err != nil {
				t.Fatal(err)
			}
			want := oneDevice(t, openTestMixture(t, entries, seq), g, seq, steps)
			got := devices(t, openTestMixture(t, entries, seq), g, seq, steps)
			sameBatches(t, fmt.Sprintf("%d devices, accumulate %d", n, accumulate), got, want)
		}
	}
}

// A run's data cursor after two steps on 2 devices is the one-device
// run's, and resuming from it on 1 or 3 devices trains the steps the run
// that never stopped trains.
func TestDataResumesOnAnotherNumberOfDevices(t *testing.T) {
	entries := testEntries(t)
	const seq, accumulate, batch = 16, 6, 2
	g1, _ := NewGlobalBatch(batch, accumulate, 1)
	one := openTestMixture(t, entries, seq)
	whole := oneDevice(t, one, g1, seq, 4)

	ref := openTestMixture(t, entries, seq)
	oneDevice(t, ref, g1, seq, 2)
	wantCur, err := ref.Cursor()
	if err != nil {
		t.Fatal(err)
	}
	g2, _ := NewGlobalBatch(batch, accumulate, 2)
	two := openTestMixture(t, entries, seq)
	sameBatches(t, "2 devices, steps 1-2", devices(t, two, g2, seq, 2), whole[:2*accumulate])
	cur, err := two.Cursor()
	if err != nil {
		t.Fatal(err)
	}
	if string(cur) != string(wantCur) {
		t.Fatalf("the cursor after two steps on 2 devices is %s, on one %s", cur, wantCur)
	}
	for _, n := range []int{1, 3} {
		g, _ := NewGlobalBatch(batch, accumulate, n)
		m := openTestMixture(t, entries, seq)
		if err := m.Seek(json.RawMessage(cur)); err != nil {
			t.Fatal(err)
		}
		sameBatches(t, fmt.Sprintf("resumed on %d devices, steps 3-4", n), devices(t, m, g, seq, 2), whole[2*accumulate:])
	}
}

// Hosts that each read their share of a round with their own Mixture
// give their devices what one host reading the whole round gives them,
// and end the round at its cursor.
func TestHostsReadTheirShareOfARound(t *testing.T) {
	entries := testEntries(t)
	const seq = 16
	g, err := NewGlobalBatch(3, 8, 4)
	if err != nil {
		t.Fatal(err)
	}
	single := openTestMixture(t, entries, seq)
	hosts := []*Mixture{openTestMixture(t, entries, seq), openTestMixture(t, entries, seq)}
	for j := 0; j < 2*g.PerDevice(); j++ {
		want, err := g.Round(context.Background(), single, seq, tokens.Share{Rank: 0, Ranks: 1})
		if err != nil {
			t.Fatal(err)
		}
		wantCur, _ := single.Cursor()
		for h, m := range hosts {
			got, err := g.Round(context.Background(), m, seq, tokens.Share{Rank: h, Ranks: len(hosts)})
			if err != nil {
				t.Fatal(err)
			}
			sameBatches(t, fmt.Sprintf("round %d, host %d", j, h), got, want[h*2:h*2+2])
			if cur, _ := m.Cursor(); string(cur) != string(wantCur) {
				t.Fatalf("round %d: host %d's cursor %s, the single host's %s", j, h, cur, wantCur)
			}
		}
	}
	for _, host := range []tokens.Share{{Rank: 0, Ranks: 3}, {Rank: 2, Ranks: 2}, {Rank: 0, Ranks: 0}} {
		if _, err := g.Round(context.Background(), single, seq, host); err == nil || !strings.Contains(err.Error(), "cannot drive an equal share") {
			t.Errorf("host %d of %d driving 4 devices: %v", host.Rank, host.Ranks, err)
		}
	}
	if _, err := g.Round(context.Background(), newSliceData(model.Presets["tiny"].VocabSize, 4096), seq, tokens.Share{Rank: 0, Ranks: 2}); err == nil || !strings.Contains(err.Error(), "cannot be drawn in shares") {
		t.Errorf("a round on 2 hosts from data without shares: %v", err)
	}
}
