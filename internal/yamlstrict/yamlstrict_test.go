package yamlstrict

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type size int64

func (s *size) UnmarshalYAML(n *yaml.Node) error {
	v, err := strconv.ParseInt(strings.TrimSuffix(n.Value, "k"), 10, 64)
	*s = size(v * 1000)
	return err
}

type base struct {
	Model string  `yaml:"model"`
	LR    float64 `yaml:"lr"`
	Steps int     `yaml:"total_steps"`
	Seed  uint64  `yaml:"seed"`
	Parts []struct {
		Store  string  `yaml:"store"`
		Weight float64 `yaml:"weight"`
	} `yaml:"mixture"`
}

type config struct {
	base    `yaml:",inline"`
	Name    string `yaml:"-"`
	Segment struct {
		MaxSteps    int           `yaml:"max_steps"`
		MaxDuration time.Duration `yaml:"max_duration"`
	} `yaml:"segment"`
	Disk   size             `yaml:"min_free_disk"`
	Extra  *struct{ N int } `yaml:"extra"`
	Labels map[string]struct {
		Value string `yaml:"value"`
	} `yaml:"labels"`
}

func TestKnownKeysDecode(t *testing.T) {
	var c config
	err := Unmarshal([]byte(`model: tiny
lr: 3.0e-4
total_steps: 10
mixture:
  - store: code
    weight: 0.7
segment:
  max_steps: 5
  max_duration: 90m
min_free_disk: 20k
extra:
  n: 3
labels:
  a:
    value: x
`), &c)
	if err != nil {
		t.Fatal(err)
	}
	if c.Model != "tiny" || c.LR != 3e-4 || c.Steps != 10 || len(c.Parts) != 1 || c.Parts[0].Weight != 0.7 ||
		c.Segment.MaxSteps != 5 || c.Segment.MaxDuration != 90*time.Minute || c.Disk != 20000 || c.Extra.N != 3 || c.Labels["a"].Value != "x" {
		t.Errorf("decoded %+v", c)
	}
	if err := Unmarshal(nil, &c); err != nil || c.Model != "tiny" {
		t.Errorf("an empty document: %v, model %q; want no error and the value kept", err, c.Model)
	}
}

// A key no field takes is refused wherever it is, with the file's line, the
// nearest known key and the keys that place takes.
func TestUnknownKeysAreNamed(t *testing.T) {
	for _, c := range []struct {
		doc, want string
	}{
		{"model: tiny\n\ntotl_steps: 10\n", `line 3: unknown key "totl_steps" (did you mean total_steps?); the keys here are extra, labels, lr, min_free_disk, mixture, model, seed, segment, total_steps`},
		{"segment:\n  max_step: 5\n", `line 2: unknown key "max_step" (did you mean max_steps?); the keys here are max_duration, max_steps`},
		{"mixture:\n  - store: a\n  - stor: b\n", `line 3: unknown key "stor" (did you mean store?)`},
		{"labels:\n  a:\n    valeu: x\n", `line 3: unknown key "valeu" (did you mean value?)`},
		{"extra:\n  m: 1\n", `line 2: unknown key "m" (did you mean n?); the keys here are n`},
		{"name: x\n", `line 1: unknown key "name"; the keys here are`},
		{"checkpointing: 5\n", `line 1: unknown key "checkpointing"; the keys here are`},
		{"mix: 5\n", `line 1: unknown key "mix" (did you mean mixture?)`},
	} {
		var v config
		err := Unmarshal([]byte(c.doc), &v)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want %q", c.doc, err, c.want)
		}
	}
}

// A value of the wrong kind is named with its line, in YAML's words.
func TestTypeErrorsSayWhatTheValueMustBe(t *testing.T) {
	for doc, want := range map[string]string{
		"lr: fast\n":                   "line 1: cannot unmarshal !!str `fast` into a number",
		"model: x\ntotal_steps: 1.5\n": "line 2: 1.5 is not a whole number",
		"total_steps: ten\n":           "line 1: cannot unmarshal !!str `ten` into a whole number",
		// An unsigned one says so: a negative seed was "into a whole
		// number", which -1 is.
		"seed: -1\n":                       "line 1: cannot unmarshal !!int `-1` into a whole number of 0 or more",
		"segment:\n  max_duration: soon\n": `line 2: segment.max_duration: "soon" is not a duration: write one such as 30s, 5m or 1h30m`,
		// No Go type names: a struct is a mapping of settings, a slice a
		// list, a map a mapping.
		"segment: soon\n":        "line 1: cannot unmarshal !!str `soon` into a mapping of settings",
		"mixture: store\n":       "line 1: cannot unmarshal !!str `store` into a list",
		"mixture:\n  - [a, b]\n": "line 2: cannot unmarshal !!seq into a mapping of settings",
	} {
		var v config
		if err := Unmarshal([]byte(doc), &v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q", doc, err, want)
		}
	}
	var v config
	if err := Unmarshal([]byte("model: [\n"), &v); err == nil || !strings.Contains(err.Error(), "line") {
		t.Errorf("malformed YAML: %v; want yaml's error with its line", err)
	}
}

// A duration written as a bare number, which yaml refused as an !!int
// that is no time.Duration, is named with its line and key and the
// spelling to write; so is one that is no duration at all. A duration with
// its unit, a quoted one and an empty value (unset) decode as before.
func TestDurationsWithoutAUnitSayWhatToWrite(t *testing.T) {
	for doc, want := range map[string]string{
		"segment:\n  max_duration: 30\n":           "line 2: segment.max_duration: 30 has no unit: write 30s (or 5m, 1h)",
		"segment:\n  max_duration: 0\n":            "line 2: segment.max_duration: 0 has no unit: write 0s (or 5m, 1h)",
		"segment:\n  max_duration: 1.5\n":          "line 2: segment.max_duration: 1.5 has no unit: write 1.5s (or 5m, 1h)",
		"segment:\n  max_duration: -5\n":           "line 2: segment.max_duration: -5 has no unit: write -5s (or 5m, 1h)",
		"segment:\n  max_duration: \"90\"\n":       "line 2: segment.max_duration: 90 has no unit: write 90s (or 5m, 1h)",
		"segment:\n  max_duration: 0x10\n":         "line 2: segment.max_duration: 0x10 has no unit: write a duration such as 30s, 5m or 1h",
		"segment:\n  max_duration: 5 min\n":        `line 2: segment.max_duration: "5 min" is not a duration: write one such as 30s, 5m or 1h30m`,
		"segment:\n  max_duration: true\n":         `line 2: segment.max_duration: "true" is not a duration: write one such as 30s, 5m or 1h30m`,
		"segment:\n  max_duration: 3000000h\n":     "line 2: segment.max_duration: 3000000h is out of range: the longest duration is about 292 years (2562047h)",
		"timeouts:\n  fetch: 10\n":                 "line 2: timeouts.fetch: 10 has no unit: write 10s (or 5m, 1h)",
		"steps:\n  - wait: 2\n":                    "line 2: steps.wait: 2 has no unit: write 2s (or 5m, 1h)",
		"grace: 30\n":                              "line 1: grace: 30 has no unit: write 30s (or 5m, 1h)",
		"later: 7\n":                               "line 1: later: 7 has no unit: write 7s (or 5m, 1h)",
		"segment: {max_steps: 1, max_duration: 9}": "line 1: segment.max_duration: 9 has no unit: write 9s (or 5m, 1h)",
	} {
		var v struct {
			Segment struct {
				MaxSteps    int           `yaml:"max_steps"`
				MaxDuration time.Duration `yaml:"max_duration"`
			} `yaml:"segment"`
			Timeouts map[string]time.Duration `yaml:"timeouts"`
			Steps    []struct {
				Wait time.Duration `yaml:"wait"`
			} `yaml:"steps"`
			Grace time.Duration  `yaml:"grace"`
			Later *time.Duration `yaml:"later"`
		}
		err := Unmarshal([]byte(doc), &v)
		var de *DurationError
		if err == nil || err.Error() != want || !errors.As(err, &de) {
			t.Errorf("%q: %v; want %q", doc, err, want)
		}
	}
	var v config
	for doc, want := range map[string]time.Duration{
		"segment:\n  max_duration: 90m\n":    90 * time.Minute,
		"segment:\n  max_duration: \"2h\"\n": 2 * time.Hour,
		"segment:\n  max_duration: \"0\"\n":  0,
		// A tag of the writer's own: its text is read.
		"segment:\n  max_duration: !dur 30s\n": 30 * time.Second,
		// Empty: unset, the value before kept.
		"segment:\n  max_duration:\n": 7,
	} {
		v.Segment.MaxDuration = 7
		if err := Unmarshal([]byte(doc), &v); err != nil || v.Segment.MaxDuration != want {
			t.Errorf("%q: %v, %v; want %v", doc, err, v.Segment.MaxDuration, want)
		}
	}
}

// A second document after a "---" is refused, naming its lines: it was
// left unread, its keys unchecked. A "---" that opens the file or ends it
// with nothing after it is no second document.
func TestASecondDocumentIsRefused(t *testing.T) {
	for doc, want := range map[string]string{
		"model: tiny\n---\nlr: 1\n":    `line 3: a second YAML document begins at the "---" of line 2, and the file is read as one: move its settings into the first and remove the "---"`,
		"model: tiny\n---\ntotl: 1\n":  `line 3: a second YAML document begins at the "---" of line 2`,
		"---\nmodel: tiny\n---\n\nx\n": `line 5: a second YAML document begins at the "---" of line 3`,
		"model: tiny\n---\nmodel: [\n": "YAML syntax near line 3",
	} {
		var v config
		if err := Unmarshal([]byte(doc), &v); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want %q", doc, err, want)
		}
	}
	for _, doc := range []string{"---\nmodel: tiny\n", "model: tiny\n---\n", "model: tiny\n---\n# nothing more\n", "model: tiny\n...\n"} {
		var v config
		if err := Unmarshal([]byte(doc), &v); err != nil || v.Model != "tiny" {
			t.Errorf("%q: %v, model %q; want tiny", doc, err, v.Model)
		}
	}
}

func TestClosest(t *testing.T) {
	names := []string{"checkpoint_every", "eval_every", "log_every", "lr", "seq"}
	for s, want := range map[string]string{"chekpoint_every": "checkpoint_every", "sequence": "", "seqq": "seq", "checkpoint": "checkpoint_every", "zzz": ""} {
		if got := closest(s, names); got != want {
			t.Errorf("closest(%q) = %q, want %q", s, got, want)
		}
	}
}

// yaml names the line before a tab in the indentation, or says nothing of
// a tab; the error names the tab's own line.
func TestATabInTheIndentationIsNamedOnItsLine(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"model: tiny\nsegment:\n  max_steps: 5\n\tmax_duration: 90m\n", "yaml: line 4: a tab in the indentation: YAML indents with spaces only, so replace it with spaces"},
		{"model: tiny\n\tlr: 1\n", "yaml: line 2: a tab in the indentation"},
		{"mixture:\n\t- store: code\n", "yaml: line 2: a tab in the indentation"},
		{"model: tiny\nsegment:\n    \t max_steps: 5\n", "yaml: line 3: a tab in the indentation"},
		// Other syntax errors are yaml's; a tab elsewhere is no cause.
		{"model: [tiny\nlr:\t1\n", "did not find expected ',' or ']'"},
		// yaml names the line a flow began on, less one, or where it found
		// the problem: the error says near which line to look.
		{"model: tiny\nseq: 32\nlr: [1\n", "YAML syntax near line 2: did not find expected ',' or ']' (check the brackets, quotes, colons and indentation around it)"},
	} {
		var cf config
		err := Unmarshal([]byte(c.doc), &cf)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error containing %q", c.doc, err, c.want)
		}
	}
	// Tabs inside a value are the value's.
	var v struct {
		Text string `yaml:"text"`
	}
	if err := Unmarshal([]byte("text: |\n  a\tb\n"), &v); err != nil || v.Text != "a\tb\n" {
		t.Errorf("a tab inside a block scalar: %q, %v", v.Text, err)
	}
}
