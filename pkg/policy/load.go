package policy

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed default-policy.yaml
var defaultYAML []byte

// DefaultYAML returns the default policy as a commented YAML file, a starting
// point for a policy file. Parse(DefaultYAML()) equals Default().
func DefaultYAML() []byte { return bytes.Clone(defaultYAML) }

// ParseFile is Parse for the contents b of the policy file name: an error
// names the file. The package does no I/O: the caller reads the file.
func ParseFile(name string, b []byte) (*Policy, error) {
	p, err := Parse(b)
	if fe, ok := errors.AsType[*FieldError](err); ok {
		fe.File = name
	}
	return p, err
}

// Parse reads a policy file strictly: it starts from Default(), so a missing
// key keeps its default; an unknown key or a value of the wrong type is an
// error naming the key path (and the allowed keys); then the result is
// validated. List values replace the default list; owners merge by owner ID.
// A class section of an override starts from the base policy's section, and
// the keys it gives replace the base's values (override.go). Errors are *FieldError values carrying the line when known.
func Parse(b []byte) (*Policy, error) {
	p := Default()
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		if errors.Is(err, io.EOF) {
			return p, nil
		}
		return nil, &FieldError{Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(doc.Content) == 0 { // empty file or only comments
		return p, p.Validate()
	}
	root := doc.Content[0]
	lines := make(map[string]int)
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return p, p.Validate()
	}
	if err := checkNode(root, reflect.TypeFor[Policy](), "", lines); err != nil {
		return nil, err
	}
	if err := root.Decode(p); err != nil {
		return nil, &FieldError{Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if err := inheritOverrides(p, root); err != nil { // override.go
		return nil, err
	}
	if err := p.Validate(); err != nil {
		if fe, ok := errors.AsType[*FieldError](err); ok {
			fe.Line = lineOf(lines, fe.Path)
		}
		return nil, err
	}
	return p, nil
}

// lineOf finds the line of path, or of its nearest parent that was written.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if n, ok := lines[path]; ok {
			return n
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// checkNode walks n against the Go type t: mapping keys must be yaml fields of
// the struct, sequences and maps are walked element by element, and a scalar
// must decode into its field's type. It records the line of every path.
func checkNode(n *yaml.Node, t reflect.Type, path string, lines map[string]int) error {
	if path != "" {
		lines[path] = n.Line
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // decodes as the zero value; Validate says if that is wrong
	}
	bad := func(msg string, args ...any) error {
		return &FieldError{Line: n.Line, Path: path, Msg: fmt.Sprintf(msg, args...)}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkNode(n, t.Elem(), path, lines)
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return bad("want a mapping with keys %s", strings.Join(yamlKeys(t), ", "))
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if why, top := notOverridable[k.Value]; !ok && top && t == reflect.TypeFor[Override]() {
				return &FieldError{Line: k.Line, Path: join(path, k.Value),
					Msg: "not overridable: " + why + "; an override sets name, match and sections of (" + strings.Join(overridableSections(), ", ") + ")"}
			}
			if !ok {
				return &FieldError{Line: k.Line, Path: join(path, k.Value),
					Msg: "unknown key; allowed keys: " + strings.Join(yamlKeys(t), ", ")}
			}
			if err := checkNode(v, ft, join(path, k.Value), lines); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return bad("want a mapping")
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if err := checkNode(v, t.Elem(), join(path, k.Value), lines); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return bad("want a list")
		}
		for i, e := range n.Content {
			if err := checkNode(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), lines); err != nil {
				return err
			}
		}
	default:
		if n.Kind != yaml.ScalarNode {
			return bad("want %s", describe(t))
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			return bad("want %s, got %q", describe(t), n.Value)
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps the yaml keys of struct t, inline fields flattened, to
// their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := make(map[string]reflect.Type)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			for k, v := range yamlFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		out[name] = f.Type
	}
	return out
}

func yamlKeys(t reflect.Type) []string {
	keys := make([]string, 0, t.NumField())
	for k := range yamlFields(t) {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return t.String()
}
