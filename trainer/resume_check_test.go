package trainer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
)

// A checkpoint file of another size than trainer_state.json records is
// said to be truncated only where it is shorter: one that grew was changed
// after the checkpoint was written (an edit), which "truncated?" misled
// the reader about.
func TestACheckpointFileOfAnotherSizeSaysWhichWay(t *testing.T) {
	for _, c := range []struct {
		name  string
		spoil func(path string) error
		want  string
		not   string
	}{
		{"shorter", func(path string) error {
			fi, err := os.Stat(path)
			if err != nil {
				return err
			}
			return os.Truncate(path, fi.Size()-1)
		}, "(truncated?)", "changed after"},
		{"longer", func(path string) error {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteString(" ")
			return err
		}, "it was changed after the checkpoint was written (it grew): use an earlier checkpoint", "truncated"},
	} {
		dir, err := WriteCheckpoint(context.Background(), t.TempDir(), testSnapshot(t, 7))
		if err != nil {
			t.Fatal(err)
		}
		st, err := CheckCheckpoint(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.spoil(filepath.Join(dir, ConfigFile)); err != nil {
			t.Fatal(err)
		}
		size := st.Files[ConfigFile].Size
		_, err = CheckCheckpoint(dir)
		if err == nil || !errors.Is(err, ErrDamaged) {
			t.Fatalf("%s config.json: CheckCheckpoint = %v; want it damaged", c.name, err)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%s says %d", StateFile, size)) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), c.not) {
			t.Errorf("%s config.json: %v; want it to say %q and not %q", c.name, err, c.want, c.not)
		}
	}
}

// The checks a resume makes of its checkpoint's trainer_state.json alone
// (CheckResume, which sched enqueue train runs too, on the run's newest
// checkpoint in object storage): another tokenizer, told by its SHA-256,
// other stores or their order, another seed or seq, another model layout;
// weights, a store moved
// elsewhere whole and an unknown tokenizer pass.
func TestCheckResumeRefusesWhatTheCheckpointCannotGoOnWith(t *testing.T) {
	requireCPU(t)
	out := t.TempDir()
	vocab := model.Presets["tiny"].VocabSize
	tokA := []byte(`{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}`)
	rc := testRun(3)
	rc.Mixture = []MixtureEntry{{Store: "/data/tokens/code", Weight: 1}, {Store: "/data/tokens/web", Weight: 1}}
	if _, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), Tokenizer: tokA, TokenizerName: "tk"}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, StepDir(3))
	st, err := CheckCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	same := tokenizerOf("tk", tokA)
	if same.SHA256 != st.Files[TokenizerFile].SHA256 {
		t.Fatalf("the run's tokenizer hashes to %s, its checkpoint's copy is listed as %s", same.SHA256, st.Files[TokenizerFile].SHA256)
	}
	want := rc.WithDefaults()
	edit := func(f func(*RunConfig)) RunConfig {
		r := want
		r.Mixture = append([]MixtureEntry(nil), want.Mixture...)
		f(&r)
		return r
	}
	for _, c := range []struct {
		name string
		rc   RunConfig
		tok  tokens.Tokenizer
		say  string // "" passes
	}{
		{"as it was", want, same, ""},
		{"weights changed, a store moved elsewhere whole", edit(func(r *RunConfig) {
			r.Mixture[0] = MixtureEntry{Store: "/elsewhere/code", Weight: 3}
		}), same, ""},
		{"no tokenizer given", want, tokens.Tokenizer{}, ""},
		{"another tokenizer of the same name", want, tokens.Tokenizer{Name: "tk", SHA256: strings.Repeat("ab", 32)},
			"was trained with tokenizer tk (sha256 " + same.SHA256[:12] + "), but this run gives tokenizer tk (sha256 abababababab)"},
		{"a store added", edit(func(r *RunConfig) { r.Mixture = append(r.Mixture, MixtureEntry{Store: "big", Weight: 1}) }), same,
			"trained on the stores code, web, in that order; this run names code, web, big"},
		{"stores swapped", edit(func(r *RunConfig) { r.Mixture[0], r.Mixture[1] = r.Mixture[1], r.Mixture[0] }), same,
			"this run names web, code"},
		{"another seed", edit(func(r *RunConfig) { r.Seed++ }), same, fmt.Sprintf("was trained with seed %d and seq %d", want.Seed, want.Seq)},
		{"another model", edit(func(r *RunConfig) { r.Model = "small" }), same, "holds a model of another layout, vocab 4096 (this run's: vocab 16384), d_model 64 (this run's: d_model 512), "},
		{"experts added", edit(func(r *RunConfig) { r.MoE = &MoEConfig{Experts: 4, TopK: 2} }), same, "(dense) (this run's: d_ff 176 (4 experts, top 2)): give the run the model it was trained with"},
	} {
		err := CheckResume(dir, st, c.rc, c.tok)
		switch {
		case c.say == "" && err != nil:
			t.Errorf("%s: %v; want it resumed", c.name, err)
		case c.say != "" && (err == nil || !isBadInput(err) || !strings.Contains(err.Error(), c.say) || !strings.Contains(err.Error(), dir+" (step 3)")):
			t.Errorf("%s: %v; want bad input naming %s (step 3) and saying %q", c.name, err, dir, c.say)
		}
	}
}

// A run resumed from a checkpoint whose engine cannot hold its step fails
// with the memory error marked as a resume's (ResumedError, of the step):
// the advice given on it (runs.SizeAdvice) leaves its seq alone, which its
// checkpoints hold it to. A fresh run's is not marked.
func TestAResumedRunTooLargeForItsHostIsMarkedResumed(t *testing.T) {
	requireCPU(t)
	out := t.TempDir()
	vocab := model.Presets["tiny"].VocabSize
	if _, err := Run(context.Background(), Config{Run: testRun(3), Out: out, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	// No host holds this batch: the engine refuses it before allocating
	// (no evaluation: its check would draw a batch of that size first).
	huge := testRun(6)
	huge.Batch, huge.EvalEvery = 1<<24, 0
	_, err := Run(context.Background(), Config{Run: huge, Out: out, Resume: true, Data: newSliceData(vocab, 20000)}, Hooks{})
	var me *model.MemoryError
	var resumed *ResumedError
	if !errors.As(err, &me) || !errors.As(err, &resumed) || resumed.Step != 3 {
		t.Fatalf("a resume from step 3 too large for this host: %v (%T); want a memory error marked resumed from step 3", err, err)
	}
	_, err = Run(context.Background(), Config{Run: huge, Out: t.TempDir(), Data: newSliceData(vocab, 20000)}, Hooks{})
	if !errors.As(err, &me) || errors.As(err, &resumed) {
		t.Fatalf("a fresh run too large for this host: %v; want a memory error not marked resumed", err)
	}
}
