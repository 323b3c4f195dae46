// Package yamlstrict decodes YAML onto Go values refusing keys that no
// field takes: a misspelt setting in a run or config file must be an error
// that names the file's line, the key and the keys that place takes, not a
// default silently used for a month.
package yamlstrict

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/internal/durlimit"
	"github.com/kiln-lm/kiln/internal/nearest"
)

// Unmarshal decodes the YAML document b onto v (a pointer). An empty
// document leaves v as it is.
func Unmarshal(b []byte, v any) error {
	doc, err := Parse(b)
	if err != nil || len(doc.Content) == 0 {
		return err
	}
	return Decode(doc, v)
}

// Parse reads the YAML document b into its node (of no content when b
// holds none). A tab in the indentation, which YAML forbids and an editor
// can put there unseen, is named on its own line: yaml names the line
// before it, or no tab at all. A second document (after a "---") is
// refused: decoding reads the first alone, so its settings, misspelt keys
// too, would go unread without a word.
func Parse(b []byte) (*yaml.Node, error) {
	var doc yaml.Node
	d := yaml.NewDecoder(bytes.NewReader(b))
	err := d.Decode(&doc)
	switch {
	case errors.Is(err, io.EOF):
		return &yaml.Node{Kind: yaml.DocumentNode}, nil
	case err != nil:
		return nil, tabbed(b, err)
	}
	for {
		var next yaml.Node
		err := d.Decode(&next)
		switch {
		case errors.Is(err, io.EOF):
			return &doc, nil
		case err != nil:
			return nil, tabbed(b, err)
		}
		// A "---" with nothing after it ends the file, as "..." does.
		if len(next.Content) == 0 || next.Content[0].ShortTag() == "!!null" && next.Content[0].Value == "" {
			continue
		}
		return nil, fmt.Errorf("line %d: a second YAML document begins at the \"---\" of line %d, and the file is read as one: move its settings into the first and remove the \"---\"",
			next.Content[0].Line, next.Line)
	}
}

// tabbed returns yaml's syntax error err as a tab in the indentation of
// the line it is on, where yaml's line (or the next) begins with one.
func tabbed(b []byte, err error) error {
	var at int
	if _, scanErr := fmt.Sscanf(err.Error(), "yaml: line %d:", &at); scanErr != nil {
		return err
	}
	lines := bytes.Split(b, []byte("\n"))
	for n := at; n <= at+1 && n <= len(lines); n++ {
		line := lines[n-1]
		indent := line[:len(line)-len(bytes.TrimLeft(line, " \t"))]
		if bytes.IndexByte(indent, '\t') >= 0 && len(indent) < len(line) {
			return fmt.Errorf("yaml: line %d: a tab in the indentation: YAML indents with spaces only, so replace it with spaces", n)
		}
	}
	// yaml names the line a construct began on (counted from 0 for some
	// errors, so the line before it), or where it found the problem, which
	// can be lines after the mistake: near, not at.
	msg := strings.TrimPrefix(err.Error(), fmt.Sprintf("yaml: line %d: ", at))
	return fmt.Errorf("YAML syntax near line %d: %s (check the brackets, quotes, colons and indentation around it)", at, msg)
}

// Decode decodes n onto v (a pointer) as yaml.Node.Decode does, after
// checking every mapping key in n against the yaml names of the fields of
// v's type, inline structs included. Line numbers are n's, so those of the
// file n was parsed from.
func Decode(n *yaml.Node, v any) error {
	if err := checkKeys(n, reflect.TypeOf(v), ""); err != nil {
		return err
	}
	if err := n.Decode(v); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return errors.New(plainTypes(strings.Join(te.Errors, "; ")))
		}
		return err
	}
	return nil
}

// goType is a Go type that yaml's type errors name, after "into ".
var goType = regexp.MustCompile(`into (struct \{[^{}]*\}|\*?(?:\[\]|map\[[\w.]+\])*[\w.]+)`)

// plainTypes names the Go types of yaml's type errors as a YAML writer
// knows them: a number, a list, a mapping of settings.
func plainTypes(msg string) string {
	return goType.ReplaceAllStringFunc(msg, func(m string) string {
		t := strings.TrimPrefix(strings.TrimPrefix(m, "into "), "*")
		var plain string
		switch {
		case strings.HasPrefix(t, "[]"):
			plain = "a list"
		case strings.HasPrefix(t, "map["):
			plain = "a mapping"
		case t == "float64" || t == "float32":
			plain = "a number"
		case strings.HasPrefix(t, "uint"):
			// A negative number is what such a type refuses most.
			plain = "a whole number of 0 or more"
		case strings.HasPrefix(t, "int"):
			plain = "a whole number"
		case t == "bool":
			plain = "true or false"
		case t == "string":
			plain = "a string"
		case t == "time.Duration":
			plain = "a duration such as 90m or 2h30m"
		case strings.Contains(t, ".") || strings.HasPrefix(t, "struct {"):
			// A struct of the program's: its settings, as a mapping.
			plain = "a mapping of settings"
		default:
			return m
		}
		return "into " + plain
	})
}

var (
	unmarshaler  = reflect.TypeFor[yaml.Unmarshaler]()
	durationType = reflect.TypeFor[time.Duration]()
)

// DurationError is a duration a file writes without a unit (30, which
// yaml refuses in its own words as an !!int that is no time.Duration) or
// that is no duration at all (5 minutes).
type DurationError struct {
	Line int
	// Key is the key the value is written under, with the keys above it
	// (segment.max_duration) from where decoding began.
	Key string
	// Value is the value as written, without its quotes.
	Value string
	// Number is true for a number written without a unit.
	Number bool
}

// plainNumber is a number that "s" after it makes a duration: 30, 1.5, -5.
var plainNumber = regexp.MustCompile(`^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)$`)

func (e *DurationError) Error() string {
	at := fmt.Sprintf("line %d: ", e.Line)
	if e.Key != "" {
		at += e.Key + ": "
	}
	switch {
	case durlimit.Past(e.Value):
		return fmt.Sprintf("%s%s is out of range: %s", at, e.Value, durlimit.Longest)
	case !e.Number:
		return fmt.Sprintf("%s%q is not a duration: write one such as 30s, 5m or 1h30m", at, e.Value)
	case plainNumber.MatchString(e.Value):
		return fmt.Sprintf("%s%s has no unit: write %ss (or 5m, 1h)", at, e.Value, e.Value)
	}
	return fmt.Sprintf("%s%s has no unit: write a duration such as 30s, 5m or 1h", at, e.Value)
}

// checkDuration refuses a scalar n that does not decode as a
// time.Duration, which yaml reads with time.ParseDuration from a string
// alone: a number above all, which a YAML writer takes for seconds and
// yaml refuses in its own words. An empty value (null) is left unset, as
// yaml leaves it; a list or a mapping is left to yaml's type error.
func checkDuration(n *yaml.Node, key string) error {
	if n.Kind != yaml.ScalarNode {
		return nil
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!int", "!!float":
		return &DurationError{Line: n.Line, Key: key, Value: n.Value, Number: true}
	}
	// A string, or a value of a tag of the writer's own (!dur 30s), which
	// yaml decodes as its text.
	if _, err := time.ParseDuration(n.Value); err == nil {
		return nil
	}
	// "30", quoted, is the number still.
	return &DurationError{Line: n.Line, Key: key, Value: n.Value, Number: plainNumber.MatchString(n.Value)}
}

// checkKeys checks n, the value of key (the keys above it joined by ".",
// "" at the top) against t.
func checkKeys(n *yaml.Node, t reflect.Type, key string) error {
	for n.Kind == yaml.DocumentNode || n.Kind == yaml.AliasNode {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		} else if len(n.Content) > 0 {
			n = n.Content[0]
		} else {
			return nil
		}
	}
	if t == nil {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		if t.Implements(unmarshaler) {
			return nil
		}
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		return nil
	}
	if t == durationType {
		return checkDuration(n, key)
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		// yaml.v3 would store 2.5 as 2.
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" {
			if f, err := strconv.ParseFloat(n.Value, 64); err == nil && f != math.Trunc(f) {
				return fmt.Errorf("line %d: %s is not a whole number", n.Line, n.Value)
			}
		}
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields := map[string]reflect.Type{}
		collectFields(t, fields)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind == yaml.ScalarNode && k.Value == "<<" {
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				return unknownKey(k, fields)
			}
			if err := checkKeys(n.Content[i+1], ft, join(key, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind == yaml.SequenceNode {
			for _, c := range n.Content {
				if err := checkKeys(c, t.Elem(), key); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 1; i < len(n.Content); i += 2 {
				if err := checkKeys(n.Content[i], t.Elem(), join(key, n.Content[i-1].Value)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// join is key below parent, as a path of keys.
func join(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// collectFields maps the yaml names of t's exported fields to their types,
// descending into fields tagged ",inline".
func collectFields(t reflect.Type, into map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		inline := strings.Contains(","+opts+",", ",inline,")
		if name == "-" || !f.IsExported() && !inline {
			continue
		}
		if inline {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				collectFields(ft, into)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		into[name] = f.Type
	}
}

func unknownKey(k *yaml.Node, fields map[string]reflect.Type) error {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	hint := ""
	if near := closest(k.Value, names); near != "" {
		hint = fmt.Sprintf(" (did you mean %s?)", near)
	}
	return fmt.Errorf("line %d: unknown key %q%s; the keys here are %s", k.Line, k.Value, hint, strings.Join(names, ", "))
}

// closest is the name within two edits of s, or one that s is a prefix
// of, or "".
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, name := range names {
		if d := nearest.Distance(s, name); d < bestD {
			best, bestD = name, d
		}
	}
	if best == "" && len(s) >= 3 {
		for _, name := range names {
			if strings.HasPrefix(name, s) {
				return name
			}
		}
	}
	return best
}
