package ingest

import (
	_ "embed"
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/kiln-lm/kiln/internal/yamlstrict"
	"github.com/kiln-lm/kiln/store"
)

//go:embed presets.yaml
var presetsYAML []byte

// LocalPrefix names a local dataset: "local:<glob>" reads the files that
// match the glob, each by its format.
const LocalPrefix = "local:"

// Preset describes a dataset kiln knows how to ingest.
type Preset struct {
	Name     string `yaml:"-" json:"name"`
	Repo     string `yaml:"repo" json:"repo"`
	Revision string `yaml:"revision" json:"revision"`
	// Include are path.Match patterns of the files to read; {var} is
	// replaced by each value of Vars[var].
	Include     []string            `yaml:"include" json:"include"`
	Vars        map[string][]string `yaml:"vars,omitempty" json:"vars,omitempty"`
	Columns     Columns             `yaml:"columns" json:"columns"`
	Description string              `yaml:"description,omitempty" json:"description,omitempty"`
	// Glob is set for local datasets instead of Repo. A task never carries
	// it: local:<glob> names its preset whole.
	Glob string `yaml:"-" json:"-"`
}

// PresetError is an unknown or malformed preset: the user's to fix.
type PresetError struct{ Err error }

func (e *PresetError) Error() string  { return e.Err.Error() }
func (e *PresetError) Unwrap() error  { return e.Err }
func (e *PresetError) BadInput() bool { return true }

// Presets returns the embedded presets, with those of overrideFile (YAML in
// the same shape; KILN_DATASETS when empty) replacing or adding entries.
func Presets(overrideFile string) (map[string]Preset, error) {
	out, err := parsePresets(presetsYAML, "the embedded presets")
	if err != nil {
		return nil, err
	}
	if overrideFile == "" {
		overrideFile = os.Getenv("KILN_DATASETS")
	}
	if overrideFile != "" {
		b, err := os.ReadFile(overrideFile)
		if err != nil {
			return nil, &PresetError{fmt.Errorf("reading dataset presets %s: %w (set KILN_DATASETS or --presets to a YAML file)", overrideFile, err)}
		}
		more, err := parsePresets(b, overrideFile)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, more)
	}
	return out, nil
}

func parsePresets(b []byte, where string) (map[string]Preset, error) {
	var m map[string]Preset
	if err := yamlstrict.Unmarshal(b, &m); err != nil {
		return nil, &PresetError{fmt.Errorf("%s: not valid preset YAML: %w", where, err)}
	}
	for name, p := range m {
		p.Name = name
		if p.Revision == "" {
			p.Revision = "main"
		}
		if err := p.validate(); err != nil {
			return nil, &PresetError{fmt.Errorf("%s: preset %q: %w", where, name, err)}
		}
		m[name] = p
	}
	return m, nil
}

func (p Preset) validate() error {
	// The name is the dataset's on the command line and its store's by
	// default.
	if strings.HasPrefix(p.Name, LocalPrefix) {
		return fmt.Errorf("a name beginning %q names a local glob, which a preset cannot be: name it otherwise", LocalPrefix)
	}
	if err := store.CheckName("dataset", p.Name); err != nil {
		return err
	}
	if p.Repo == "" || strings.Count(p.Repo, "/") != 1 {
		return fmt.Errorf("repo %q is not an owner/name dataset id", p.Repo)
	}
	if len(p.Include) == 0 {
		return fmt.Errorf("include lists no file patterns")
	}
	for _, k := range slices.Sorted(maps.Keys(p.Vars)) {
		if len(p.Vars[k]) == 0 {
			return fmt.Errorf("vars.%s lists no values, so the patterns that use {%s} match nothing: list its values, or drop it and its {%s}", k, k, k)
		}
	}
	for _, pat := range p.Include {
		for _, m := range varRef.FindAllStringSubmatch(pat, -1) {
			if _, ok := p.Vars[m[1]]; !ok {
				return fmt.Errorf("include pattern %q uses {%s}, which vars does not define: add vars.%s with its values", pat, m[1], m[1])
			}
		}
	}
	for _, pat := range p.Patterns() {
		if _, err := path.Match(pat, ""); err != nil {
			return fmt.Errorf("include pattern %q: %w", pat, err)
		}
	}
	return nil
}

// varRef is a {name} in an include pattern, which vars fills in.
var varRef = regexp.MustCompile(`\{(\w+)\}`)

// LookupPreset finds name among presets, or builds a local preset from
// "local:<glob>". An unknown name lists the known ones.
func LookupPreset(presets map[string]Preset, name string) (Preset, error) {
	if glob, ok := strings.CutPrefix(name, LocalPrefix); ok {
		if glob == "" {
			return Preset{}, &PresetError{fmt.Errorf("dataset %q names no files: use local:<glob>, for example local:'data/*.jsonl.zst'", name)}
		}
		if _, err := path.Match(glob, ""); err != nil {
			return Preset{}, &PresetError{fmt.Errorf("dataset %q: bad glob (%w): a glob takes *, ? and [...] ranges; write a literal [ as \\[", name, err)}
		}
		return Preset{Name: name, Glob: glob, Revision: "local"}, nil
	}
	p, ok := presets[name]
	if !ok {
		return Preset{}, &PresetError{fmt.Errorf("unknown dataset %q: use one of %s, or local:<glob> (see 'sched datasets')", name, strings.Join(slices.Sorted(maps.Keys(presets)), ", "))}
	}
	return p, nil
}

// Carried is p as a queued task carries it (PlanJob.Preset), so that the
// worker reads the dataset as the command that queued it resolved it, its
// presets file (--presets, KILN_DATASETS) included. A local dataset's name
// describes it but for its columns: it carries those alone, and nothing
// when it reads the default ones.
func Carried(p Preset) *Preset {
	if p.Glob != "" {
		if p.Columns == (Columns{}) {
			return nil
		}
		return &Preset{Name: p.Name, Revision: p.Revision, Columns: p.Columns}
	}
	return &p
}

// ResolvePreset is the preset of a queued task that names dataset name: the
// one it carries, checked as a presets file's entry is, or else name looked
// up in presets (the worker's own; tasks queued before tasks carried their
// preset). A local dataset is its name's, with the columns it carries.
func ResolvePreset(presets map[string]Preset, name string, carried *Preset) (Preset, error) {
	if carried == nil || strings.HasPrefix(name, LocalPrefix) {
		p, err := LookupPreset(presets, name)
		if err == nil && carried != nil {
			p.Columns = carried.Columns
		}
		return p, err
	}
	p := *carried
	if p.Name != name {
		return Preset{}, &PresetError{fmt.Errorf("the task names dataset %q but carries the preset of %q: queue it again with 'sched enqueue'", name, p.Name)}
	}
	if err := p.validate(); err != nil {
		return Preset{}, &PresetError{fmt.Errorf("the task's preset of %q: %w: queue it again with 'sched enqueue'", name, err)}
	}
	return p, nil
}

// WithColumns returns p reading the columns (parquet) or fields (JSON
// lines) that spec names in place of its own: "text=content,id=path", of
// the keys text, id, blob and encoding.
func (p Preset) WithColumns(spec string) (Preset, error) {
	if spec == "" {
		return p, nil
	}
	c := p.Columns
	for _, kv := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return p, &PresetError{fmt.Errorf("--columns %q: want key=column[,key=column...] of the keys text, id, blob and encoding, for example text=content", spec)}
		}
		switch k {
		case "text":
			c.Text = v
		case "id":
			c.ID = v
		case "blob":
			c.Blob = v
		case "encoding":
			c.Encoding = v
		default:
			return p, &PresetError{fmt.Errorf("--columns %q: unknown key %q: give text, id, blob or encoding", spec, k)}
		}
	}
	p.Columns = c
	return p, nil
}

// WithVars returns p with the values of its vars replaced by set
// ("language" -> ["Python", "Go"]); an unknown var is an error.
func (p Preset) WithVars(set map[string][]string) (Preset, error) {
	if len(set) == 0 {
		return p, nil
	}
	vars := maps.Clone(p.Vars)
	for k, v := range set {
		if _, ok := vars[k]; !ok {
			known := slices.Sorted(maps.Keys(p.Vars))
			return p, &PresetError{fmt.Errorf("dataset %s has no variable %q (it has: %v)", p.Name, k, known)}
		}
		vars[k] = v
	}
	p.Vars = vars
	return p, nil
}

// Patterns expands Include over every combination of Vars.
func (p Preset) Patterns() []string {
	var pats []string
	for _, e := range p.expand() {
		pats = append(pats, e.pattern)
	}
	return pats
}

// expansion is one of Include's patterns with a value of each var it
// names put in.
type expansion struct {
	pattern string
	values  []string // name=value, one a var the pattern names
}

func (p Preset) expand() []expansion {
	var out []expansion
	for _, pat := range p.Include {
		out = append(out, expansion{pattern: pat})
	}
	for _, k := range slices.Sorted(maps.Keys(p.Vars)) {
		var next []expansion
		for _, e := range out {
			if !strings.Contains(e.pattern, "{"+k+"}") {
				next = append(next, e)
				continue
			}
			for _, v := range p.Vars[k] {
				next = append(next, expansion{strings.ReplaceAll(e.pattern, "{"+k+"}", v), append(slices.Clip(e.values), k+"="+v)})
			}
		}
		out = next
	}
	return out
}

// unmatchedValues are the var values (name=value) no file matched in any
// of the patterns they were put in, hits[i] being the files pats[i]
// matched, and those patterns.
func unmatchedValues(pats []expansion, hits []int) (values, patterns []string) {
	matched := map[string]bool{}
	for i, e := range pats {
		for _, v := range e.values {
			matched[v] = matched[v] || hits[i] > 0
		}
	}
	for i, e := range pats {
		missed := false
		for _, v := range e.values {
			if !matched[v] {
				missed = true
				if !slices.Contains(values, v) {
					values = append(values, v)
				}
			}
		}
		if missed && hits[i] == 0 {
			patterns = append(patterns, e.pattern)
		}
	}
	return values, patterns
}

// Match reports whether a repository path is one of the preset's files.
func (p Preset) Match(file string) bool {
	for _, pat := range p.Patterns() {
		if ok, _ := path.Match(pat, file); ok {
			return true
		}
	}
	return false
}

// ListRoots are the directories to list: the fixed leading part of each
// pattern, so that a language filter does not list all 600 languages.
func (p Preset) ListRoots() []string {
	seen := map[string]bool{}
	var roots []string
	for _, pat := range p.Patterns() {
		var fixed []string
		for _, seg := range strings.Split(path.Dir(pat), "/") {
			if strings.ContainsAny(seg, "*?[\\") || seg == "." {
				break
			}
			fixed = append(fixed, seg)
		}
		root := strings.Join(fixed, "/")
		if !seen[root] {
			seen[root] = true
			roots = append(roots, root)
		}
	}
	return roots
}
