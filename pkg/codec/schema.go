package codec

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
)

// This file parses Avro schema text into the types schema resolution
// (resolve.go) walks, and turns field defaults into goavro native values.

// schema is one parsed Avro type.
type schema struct {
	kind     string // a primitive name, record, enum, array, map, fixed or union
	name     string // full name of a named type
	aliases  []string
	logical  string
	fields   []*field
	symbols  []string
	enumDef  string
	items    *schema // array items, map values
	branches []*schema
	size     int
}

type field struct {
	name    string
	aliases []string
	typ     *schema
	def     any // the JSON default
	hasDef  bool
}

// parseSchema parses a schema's JSON text.
func parseSchema(text string) (*schema, error) {
	var root any
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	if err := d.Decode(&root); err != nil {
		return nil, fmt.Errorf("codec: schema is not JSON: %w", err)
	}
	p := parser{named: map[string]*schema{}}
	return p.parse(root, "")
}

type parser struct {
	named map[string]*schema
	depth int
}

var primitiveKinds = map[string]bool{
	"null": true, "boolean": true, "int": true, "long": true, "float": true, "double": true, "bytes": true, "string": true,
}

func qualified(name, ns string) string {
	if strings.Contains(name, ".") || ns == "" {
		return name
	}
	return ns + "." + name
}

func (p *parser) parse(t any, ns string) (*schema, error) {
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > 64 {
		return nil, fmt.Errorf("codec: schema nests deeper than 64 levels")
	}
	switch t := t.(type) {
	case string:
		if primitiveKinds[t] {
			return &schema{kind: t}, nil
		}
		if s, ok := p.named[qualified(t, ns)]; ok {
			return s, nil
		}
		if s, ok := p.named[t]; ok {
			return s, nil
		}
		return nil, fmt.Errorf("codec: schema: unknown type %q", t)
	case []any:
		u := &schema{kind: "union"}
		for _, b := range t {
			s, err := p.parse(b, ns)
			if err != nil {
				return nil, err
			}
			u.branches = append(u.branches, s)
		}
		return u, nil
	case map[string]any:
		kind, _ := t["type"].(string)
		logical, _ := t["logicalType"].(string)
		switch kind {
		case "record", "error", "enum", "fixed":
		default:
			if kind == "" {
				return p.parse(t["type"], ns)
			}
			if primitiveKinds[kind] {
				return &schema{kind: kind, logical: logical}, nil
			}
			if kind != "array" && kind != "map" {
				return p.parse(kind, ns)
			}
		}
		s := &schema{kind: kind, logical: logical}
		if kind == "error" {
			s.kind = "record"
		}
		if name, _ := t["name"].(string); name != "" {
			if tns, ok := t["namespace"].(string); ok && !strings.Contains(name, ".") {
				ns = tns
			}
			s.name = qualified(name, ns)
			if i := strings.LastIndexByte(s.name, '.'); i >= 0 {
				ns = s.name[:i]
			} else {
				ns = ""
			}
			p.named[s.name] = s
			if as, ok := t["aliases"].([]any); ok {
				for _, a := range as {
					if a, ok := a.(string); ok {
						s.aliases = append(s.aliases, qualified(a, ns))
					}
				}
			}
		}
		switch s.kind {
		case "record":
			fs, _ := t["fields"].([]any)
			for _, f := range fs {
				fm, _ := f.(map[string]any)
				name, _ := fm["name"].(string)
				typ, err := p.parse(fm["type"], ns)
				if err != nil {
					return nil, fmt.Errorf("codec: schema: field %s: %w", name, err)
				}
				fd := &field{name: name, typ: typ}
				fd.def, fd.hasDef = fm["default"]
				if as, ok := fm["aliases"].([]any); ok {
					for _, a := range as {
						if a, ok := a.(string); ok {
							fd.aliases = append(fd.aliases, a)
						}
					}
				}
				s.fields = append(s.fields, fd)
			}
		case "enum":
			syms, _ := t["symbols"].([]any)
			for _, x := range syms {
				if x, ok := x.(string); ok {
					s.symbols = append(s.symbols, x)
				}
			}
			s.enumDef, _ = t["default"].(string)
		case "fixed":
			if n, ok := t["size"].(json.Number); ok {
				size, _ := n.Int64()
				s.size = int(size)
			}
		case "array", "map":
			key := "items"
			if s.kind == "map" {
				key = "values"
			}
			items, err := p.parse(t[key], ns)
			if err != nil {
				return nil, err
			}
			s.items = items
		}
		return s, nil
	}
	return nil, fmt.Errorf("codec: schema: unexpected %T", t)
}

// unionName is goavro's name of a union branch of type s.
func (s *schema) unionName() string {
	switch {
	case s.name != "":
		return s.name
	case s.logical != "":
		return s.kind + "." + s.logical
	}
	return s.kind
}

// short is a named type's unqualified name.
func short(name string) string { return name[strings.LastIndexByte(name, '.')+1:] }

// namesMatch tells whether a writer's named type reads as the reader's:
// the same unqualified name, or a reader alias naming the writer's.
func namesMatch(w, r *schema) bool {
	if short(w.name) == short(r.name) {
		return true
	}
	for _, a := range r.aliases {
		if a == w.name || short(a) == short(w.name) {
			return true
		}
	}
	return false
}

// describe names a type in an error message.
func (s *schema) describe() string {
	if s.name != "" {
		return s.kind + " " + s.name
	}
	if s.logical != "" {
		return s.kind + " (" + s.logical + ")"
	}
	return s.kind
}

// defaultNative is the goavro native value of a field default given in
// JSON: a union's default is of its first branch.
func defaultNative(s *schema, def any) (any, error) {
	if s.kind == "union" {
		if len(s.branches) == 0 {
			return nil, fmt.Errorf("empty union")
		}
		b := s.branches[0]
		if b.kind == "null" {
			if def != nil {
				return nil, fmt.Errorf("a union with null first defaults to null, got %v", def)
			}
			return nil, nil
		}
		v, err := defaultNative(b, def)
		if err != nil {
			return nil, err
		}
		return map[string]any{b.unionName(): v}, nil
	}
	num := func() (json.Number, error) {
		n, ok := def.(json.Number)
		if !ok {
			return "", fmt.Errorf("want a number for %s, got %v", s.kind, def)
		}
		return n, nil
	}
	switch s.kind {
	case "null":
		if def != nil {
			return nil, fmt.Errorf("want null, got %v", def)
		}
		return nil, nil
	case "boolean":
		b, ok := def.(bool)
		if !ok {
			return nil, fmt.Errorf("want a boolean, got %v", def)
		}
		return b, nil
	case "int":
		n, err := num()
		if err != nil {
			return nil, err
		}
		i, err := n.Int64()
		if err != nil || i < math.MinInt32 || i > math.MaxInt32 {
			return nil, fmt.Errorf("want an int, got %v", def)
		}
		return int32(i), nil
	case "long":
		n, err := num()
		if err != nil {
			return nil, err
		}
		i, err := n.Int64()
		if err != nil {
			return nil, fmt.Errorf("want a long, got %v", def)
		}
		if s.logical == "timestamp-millis" {
			return time.UnixMilli(i).UTC(), nil
		}
		return i, nil
	case "float", "double":
		n, err := num()
		if err != nil {
			return nil, err
		}
		f, err := n.Float64()
		if err != nil {
			return nil, err
		}
		if s.kind == "float" {
			return float32(f), nil
		}
		return f, nil
	case "string", "enum":
		str, ok := def.(string)
		if !ok {
			return nil, fmt.Errorf("want a string, got %v", def)
		}
		return str, nil
	case "bytes", "fixed":
		str, ok := def.(string)
		if !ok {
			return nil, fmt.Errorf("want a string, got %v", def)
		}
		b := make([]byte, 0, len(str))
		for _, r := range str { // the specification's bytes default: code points 0-255
			b = append(b, byte(r))
		}
		return b, nil
	case "array":
		xs, ok := def.([]any)
		if !ok {
			return nil, fmt.Errorf("want an array, got %v", def)
		}
		out := make([]any, len(xs))
		for i, x := range xs {
			v, err := defaultNative(s.items, x)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case "map":
		xs, ok := def.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("want an object, got %v", def)
		}
		out := make(map[string]any, len(xs))
		for k, x := range xs {
			v, err := defaultNative(s.items, x)
			if err != nil {
				return nil, err
			}
			out[k] = v
		}
		return out, nil
	case "record":
		xs, ok := def.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("want an object, got %v", def)
		}
		out := make(map[string]any, len(s.fields))
		for _, f := range s.fields {
			x, ok := xs[f.name]
			if !ok {
				if !f.hasDef {
					return nil, fmt.Errorf("field %s of the default has no value", f.name)
				}
				x = f.def
			}
			v, err := defaultNative(f.typ, x)
			if err != nil {
				return nil, err
			}
			out[f.name] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected type %s", s.kind)
}

// zeroWidth tells whether every value of s encodes in no bytes (null, an
// empty fixed, a record of such fields).
func (s *schema) zeroWidth(seen map[*schema]bool) bool {
	switch s.kind {
	case "null":
		return true
	case "fixed":
		return s.size == 0
	case "record":
		if seen[s] {
			return false
		}
		seen[s] = true
		defer delete(seen, s)
		for _, f := range s.fields {
			if !f.typ.zeroWidth(seen) {
				return false
			}
		}
		return true
	}
	return false
}

// zeroWidthArray returns the path of the first array of zero-width items
// in s, "" if there is none.
func zeroWidthArray(s *schema, path string, seen map[*schema]bool) string {
	if seen[s] {
		return ""
	}
	seen[s] = true
	switch s.kind {
	case "array":
		if s.items.zeroWidth(map[*schema]bool{}) {
			return path
		}
		return zeroWidthArray(s.items, path+"[]", seen)
	case "map":
		return zeroWidthArray(s.items, path+"{}", seen)
	case "union":
		for _, b := range s.branches {
			if p := zeroWidthArray(b, path, seen); p != "" {
				return p
			}
		}
	case "record":
		for _, f := range s.fields {
			if p := zeroWidthArray(f.typ, join(path, f.name), seen); p != "" {
				return p
			}
		}
	}
	return ""
}
