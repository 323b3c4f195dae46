// Package runs holds kiln's named training runs (pilot, long, demo) as
// embedded YAML, lets a user file override or extend them, and holds the
// bench sweep's shapes.
package runs

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/yamlstrict"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
)

//go:embed presets.yaml
var presetsYAML []byte

// Run is one named training run: the trainer's configuration plus what the
// queue needs to train it in segments and keep its checkpoints.
type Run struct {
	Name        string `yaml:"-"`
	Description string `yaml:"description"`
	// From names the run this one starts from; only its own fields differ.
	From              string `yaml:"from,omitempty"`
	trainer.RunConfig `yaml:",inline"`
	// Tokenizer names tokenizers/<name>/tokenizer.json in object storage.
	Tokenizer string    `yaml:"tokenizer"`
	Segment   Segment   `yaml:"segment"`
	Retention Retention `yaml:"retention"`
	// MinFreeDisk is the free space the worker keeps on its checkpoint
	// disk, such as "20GiB"; a checkpoint that would go below it waits for
	// uploads and retention to free space, then fails the segment.
	MinFreeDisk ByteSize `yaml:"min_free_disk"`
}

// Segment bounds one train:segment task. Zero means no bound; a segment
// with neither bound runs to the end of the run.
type Segment struct {
	MaxSteps    int           `yaml:"max_steps"`
	MaxDuration time.Duration `yaml:"max_duration"`
}

// Retention decides which checkpoints stay in object storage: the last
// KeepLast, and every KeepEvery-th (by checkpoint number, so the step is a
// multiple of KeepEvery x checkpoint_every). KeepEvery 0 keeps no extra.
type Retention struct {
	KeepLast  int `yaml:"keep_last"`
	KeepEvery int `yaml:"keep_every"`
}

// DefaultKeepLast is retention.keep_last of a new run that does not say:
// the newest checkpoints kept in object storage.
const DefaultKeepLast = 3

// ByteSize is a size in bytes written with an optional unit: 512MiB, 20GiB,
// 20G (the same), 1.5GB or a plain number (internal/bytesize).
type ByteSize int64

// UnmarshalYAML reads a ByteSize from "20GiB" or a number.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := bytesize.Parse(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = ByteSize(v)
	return nil
}

// MarshalYAML writes b in GiB or MiB where it divides evenly.
func (b ByteSize) MarshalYAML() (any, error) { return b.String(), nil }

func (b ByteSize) String() string {
	switch {
	case b != 0 && b%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", b>>30)
	case b != 0 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	}
	return strconv.FormatInt(int64(b), 10)
}

// Set is the runs known by name.
type Set map[string]Run

// Presets returns the embedded runs.
func Presets() Set {
	s, err := parse(presetsYAML, "embedded presets", nil)
	if err != nil {
		// The embedded file is tested; failing here is a build defect.
		panic(err)
	}
	return s
}

// Load returns the embedded runs with the user file at path applied on top
// ("" for none). A run the file names that is a preset keeps the preset's
// fields the file does not set; a new run starts from `from:` if given.
func Load(path string) (Set, error) {
	base := Presets()
	if path == "" {
		return base, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, inputError{fmt.Errorf("runs file: %w", err)}
	}
	return parse(b, path, base)
}

// SizeAdvice is err, where it holds a step of run that does not fit the
// memory it would train in (a *model.MemoryError), as that error alone,
// saying what to change in the run's entry of a runs file, whose fields
// are the run's sizes, rather than naming command-line flags, which
// `sched enqueue train` and the worker have none of. The wrappers' text
// holds the flags' advice (fmt.Errorf formats it as it wraps) and adds
// nothing the error does not say: the engine and both sizes. Any other
// err is returned as it is. A run resumed from a checkpoint (err holds a
// *trainer.ResumedError) is not told to take a smaller seq: its
// checkpoints' data order was drawn at theirs, and a resume at another is
// refused.
func SizeAdvice(run string, err error) error {
	var me *model.MemoryError
	if !errors.As(err, &me) || me.Plan.Purpose != model.PurposeTrain {
		return err
	}
	fixed := *me
	fixed.Fix = fmt.Sprintf("in a runs file (KILN_RUNS, here and on the GPU worker), give run %s a smaller batch and a larger accumulate (the same tokens a step)", run)
	var resumed *trainer.ResumedError
	if errors.As(err, &resumed) {
		fixed.Fix += fmt.Sprintf("; its seq stays %d, which its checkpoints (step %d) were trained at", me.Plan.Seq, resumed.Step)
	} else {
		fixed.Fix += ", or a smaller seq"
	}
	return &fixed
}

// Get returns the named run with defaults filled in and validated.
func (s Set) Get(name string) (Run, error) {
	r, ok := s[name]
	if !ok {
		return Run{}, inputError{fmt.Errorf("unknown run %q: choose one of %s, or define it in a runs file (KILN_RUNS)", name, strings.Join(s.Names(), ", "))}
	}
	r.RunConfig = r.RunConfig.WithDefaults()
	if err := r.Validate(); err != nil {
		return Run{}, err
	}
	return r, nil
}

// Names lists the runs in alphabetical order.
func (s Set) Names() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Validate checks the trainer's configuration and the run's own fields,
// naming the run and the field.
func (r Run) Validate() error {
	if err := r.RunConfig.Validate(); err != nil {
		return fmt.Errorf("run %s: %w", r.Name, err)
	}
	var msg string
	switch {
	case r.Segment.MaxSteps < 0 || r.Segment.MaxDuration < 0:
		msg = "segment.max_steps and segment.max_duration must not be negative"
	case r.Retention.KeepLast < 1:
		msg = fmt.Sprintf("retention.keep_last must be at least 1 (the checkpoint a resume starts from), got %d", r.Retention.KeepLast)
	case r.Retention.KeepEvery < 0:
		msg = fmt.Sprintf("retention.keep_every must not be negative, got %d", r.Retention.KeepEvery)
	case r.CheckpointEvery < 1:
		msg = "checkpoint_every must be at least 1: a run on the queue resumes from checkpoints"
	case r.MinFreeDisk < 0:
		msg = "min_free_disk must not be negative"
	}
	for i, m := range r.Mixture {
		// The worker reads tokens/<name> of its data directory, or an
		// absolute path: a relative path would lead out of that directory.
		if msg == "" && !filepath.IsAbs(m.Store) && store.CheckName("token store", m.Store) != nil {
			msg = fmt.Sprintf("mixture[%d] store %q: name a token store of the worker's data directory (tokens/<name>; 'sched datasets' lists them) or give an absolute path", i, m.Store)
		}
	}
	if msg != "" {
		return inputError{fmt.Errorf("run %s: %s", r.Name, msg)}
	}
	return nil
}

// parse reads a runs file onto base (nil for the embedded file itself).
// Each run is decoded in file order so that `from:` can name a run defined
// above it in the same file.
func parse(b []byte, source string, base Set) (Set, error) {
	out := Set{}
	for n, r := range base {
		out[n] = r
	}
	doc, err := yamlstrict.Parse(b)
	if err != nil {
		return nil, inputError{fmt.Errorf("runs file %s: %w", source, err)}
	}
	if len(doc.Content) == 0 {
		return out, nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, inputError{fmt.Errorf("runs file %s: line %d: the top level must map run names to runs", source, top.Line)}
	}
	// A run written twice would be the two bodies merged, the second's
	// keys over the first's: most likely a copy meant as a new run.
	lines := map[string]int{}
	for i := 0; i+1 < len(top.Content); i += 2 {
		name, body := top.Content[i].Value, top.Content[i+1]
		if err := store.CheckName("run", name); err != nil {
			return nil, inputError{fmt.Errorf("runs file %s: line %d: %w", source, top.Content[i].Line, err)}
		}
		if first, ok := lines[name]; ok {
			return nil, inputError{fmt.Errorf("runs file %s: line %d: run %s is written a second time (first at line %d): keep one, or give this one another name", source, top.Content[i].Line, name, first)}
		}
		lines[name] = top.Content[i].Line
		if body.Kind != yaml.MappingNode && !(body.Kind == yaml.ScalarNode && body.Tag == "!!null") {
			// A setting written at the top level (no run above it), or a
			// run written on one line.
			is := strconv.Quote(body.Value)
			if body.Kind != yaml.ScalarNode {
				is = "a list"
			}
			return nil, inputError{fmt.Errorf("runs file %s: line %d: run %s is %s, not its settings: write each of a run's settings on a line of its own, indented under the run's name; a setting at the top level belongs under the run it sets",
				source, top.Content[i].Line, name, is)}
		}
		// A from: key must be read before the body so that the body
		// applies on top of the run it names. It is read with the rest of
		// the body, onto a run of its own, so that a mistake in the body
		// (a key written twice) is said as the body's decode says it, on
		// one line with the line at fault: yaml's own words put that line
		// below "yaml: unmarshal errors:", which every one-line view of
		// the error (a waiting segment's status) cut off.
		var head Run
		if err := yamlstrict.Decode(body, &head); err != nil {
			return nil, inputError{fmt.Errorf("runs file %s: run %s: %w", source, name, err)}
		}
		r, exists := out[name]
		if head.From != "" {
			from, ok := out[head.From]
			if !ok {
				return nil, inputError{fmt.Errorf("runs file %s: run %s: from %q names no run defined above it", source, name, head.From)}
			}
			r, exists = from, true
			r.Description = ""
		}
		r = cloneRun(r)
		if !exists {
			// A new run's body applies on top of the defaults a run needs
			// on the queue and a person would not think to write.
			r.Retention.KeepLast = DefaultKeepLast
		}
		dropInheritedLength(body, &r)
		inheritsMoE := r.MoE != nil
		if err := yamlstrict.Decode(body, &r); err != nil {
			return nil, inputError{fmt.Errorf("runs file %s: run %s: %w", source, name, err)}
		}
		if !exists && r.Model == "" && head.From == "" {
			return nil, inputError{fmt.Errorf("runs file %s: run %s: a new run needs `from: <run>` or at least a model", source, name)}
		}
		if err := checkWritten(body, r, inheritsMoE); err != nil {
			return nil, inputError{fmt.Errorf("runs file %s: run %s: %w", source, name, err)}
		}
		r.Name, r.From = name, head.From
		out[name] = r
	}
	return out, nil
}

// dropInheritedLength drops the run length r inherits (from its `from:`
// run, or the preset of its name) when body writes the length the other
// way: total_steps and total_tokens are one setting written two ways, so
// the one body writes replaces both, or an inherited total_steps would win
// over the total_tokens written here (trainer.RunConfig.WithDefaults). A
// body that writes both keeps both, and total_steps wins, as in any run
// configuration.
func dropInheritedLength(body *yaml.Node, r *Run) {
	steps, tokens := trainer.LookupYAML(body, "total_steps") != nil, trainer.LookupYAML(body, "total_tokens") != nil
	switch {
	case steps && !tokens:
		r.TotalTokens = 0
	case tokens && !steps:
		r.TotalSteps = 0
	}
}

// checkWritten refuses what body, one run of the file decoded into r, gets
// wrong where the file and the line are still known: a value written as 0
// where 0 reads as absent (trainer.CheckZerosWritten), a moe: with nothing
// under it where the run had no experts for it to turn off (inheritsMoE:
// it had, from its from: or the preset it overrides), and a tokenizer name
// that cannot be one (refused later, it named neither the file nor the run).
func checkWritten(body *yaml.Node, r Run, inheritsMoE bool) error {
	if err := trainer.CheckZerosWritten(body, r.RunConfig); err != nil {
		return err
	}
	if err := trainer.CheckMoEWritten(body, inheritsMoE); err != nil {
		return err
	}
	if n := trainer.LookupYAML(body, "tokenizer"); n != nil {
		if err := store.CheckName("tokenizer", r.Tokenizer); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
	}
	return nil
}

// cloneRun is r with nothing shared with it: the body decoded over the
// clone (a from: run's, or an override's) writes into the pointers it
// holds, and `floor: 0.2` or `moe: {top_k: 1}` under `from: pilot` would
// change pilot's too.
func cloneRun(r Run) Run {
	r.Mixture = append([]trainer.MixtureEntry(nil), r.Mixture...)
	r.Floor, r.Clip = clonePtr(r.Floor), clonePtr(r.Clip)
	if r.MoE != nil {
		m := *r.MoE
		m.AuxCoef = clonePtr(m.AuxCoef)
		r.MoE = &m
	}
	return r
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

type inputError struct{ err error }

func (e inputError) Error() string  { return e.err.Error() }
func (e inputError) Unwrap() error  { return e.err }
func (e inputError) BadInput() bool { return true }
