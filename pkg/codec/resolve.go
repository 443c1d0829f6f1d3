package codec

import (
	"fmt"
	"time"
)

// This file resolves a writer schema that is not one of faultrouter's own
// (one a schema registry holds, e.g. a worker's evolved TaskEvent) against
// the reader schema, by the Avro specification's rules of schema
// resolution: records match by name or alias; a reader field the writer
// lacks takes its default, and has to have one; a writer field the reader
// lacks is skipped; int, long and float are promoted, and string and bytes
// read as each other; an enum symbol the reader lacks takes the reader's
// enum default; a union branch reads as the first reader branch that
// matches. The check is strict where the specification defers an error to
// read time: every branch of a writer union and every writer enum symbol
// must resolve, as the registries' compatibility checks require.

// SchemaMismatchError tells why a writer schema does not resolve against a
// reader schema, naming the field.
type SchemaMismatchError struct {
	// Path is the dotted path of the field in the reader's record, e.g.
	// "error.http_status"; "" for the record itself.
	Path string
	// Msg says what does not match.
	Msg string
}

func (e *SchemaMismatchError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return "field " + e.Path + ": " + e.Msg
}

// convert turns a goavro native value of a writer type into the native value
// of the reader type.
type convert func(any) (any, error)

func identity(x any) (any, error) { return x, nil }

// resolver compiles conversions; seen breaks the recursion of recursive
// named types.
type resolver struct {
	seen map[[2]*schema]*convert
}

// resolveSchemas returns the conversion of natives of writer w into natives
// of reader r, or a *SchemaMismatchError.
func resolveSchemas(w, r *schema) (convert, error) {
	rs := resolver{seen: map[[2]*schema]*convert{}}
	return rs.resolve(w, r, "")
}

func mismatch(path, format string, args ...any) error {
	return &SchemaMismatchError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (rs *resolver) resolve(w, r *schema, path string) (convert, error) {
	if w.kind == "union" {
		convs := map[string]convert{}
		for _, b := range w.branches {
			c, err := rs.resolve(b, r, path)
			if err != nil {
				return nil, err
			}
			convs[b.unionName()] = c
		}
		return func(x any) (any, error) {
			if x == nil {
				if c, ok := convs["null"]; ok {
					return c(nil)
				}
				return nil, fmt.Errorf("%w: %s: null is not a branch of the writer's union", ErrMalformed, path)
			}
			m, ok := x.(map[string]any)
			if !ok || len(m) != 1 {
				return nil, fmt.Errorf("%w: %s: unexpected union value %T", ErrMalformed, path, x)
			}
			for k, v := range m {
				if c, ok := convs[k]; ok {
					return c(v)
				}
				return nil, fmt.Errorf("%w: %s: union branch %s", ErrMalformed, path, k)
			}
			return nil, nil
		}, nil
	}
	if r.kind == "union" {
		// the first reader branch that the writer's type matches exactly,
		// else the first it resolves to
		var first convert
		var firstName string
		for _, b := range r.branches {
			if !sameKind(w, b) {
				continue
			}
			c, err := rs.resolve(w, b, path)
			if err != nil {
				return nil, err
			}
			first, firstName = c, b.unionName()
			break
		}
		if first == nil {
			for _, b := range r.branches {
				if c, err := rs.resolve(w, b, path); err == nil {
					first, firstName = c, b.unionName()
					break
				}
			}
		}
		if first == nil {
			return nil, mismatch(path, "the writer's %s matches no branch of the reader's union", w.describe())
		}
		if firstName == "null" {
			return func(any) (any, error) { return nil, nil }, nil
		}
		return func(x any) (any, error) {
			v, err := first(x)
			if err != nil {
				return nil, err
			}
			return map[string]any{firstName: v}, nil
		}, nil
	}
	switch r.kind {
	case "record", "enum", "fixed":
		if w.kind != r.kind || !namesMatch(w, r) {
			return nil, mismatch(path, "the reader's %s cannot read the writer's %s", r.describe(), w.describe())
		}
	case "array", "map":
		if w.kind != r.kind {
			return nil, mismatch(path, "the reader's %s cannot read the writer's %s", r.describe(), w.describe())
		}
	}
	switch r.kind {
	case "record":
		return rs.record(w, r, path)
	case "enum":
		return enumConvert(w, r, path)
	case "fixed":
		if w.size != r.size {
			return nil, mismatch(path, "the reader's fixed %s has %d bytes, the writer's %d", r.name, r.size, w.size)
		}
		return identity, nil
	case "array":
		c, err := rs.resolve(w.items, r.items, path+"[]")
		if err != nil {
			return nil, err
		}
		return func(x any) (any, error) {
			xs, ok := x.([]any)
			if !ok {
				return nil, fmt.Errorf("%w: %s: unexpected %T", ErrMalformed, path, x)
			}
			out := make([]any, len(xs))
			for i, v := range xs {
				var err error
				if out[i], err = c(v); err != nil {
					return nil, err
				}
			}
			return out, nil
		}, nil
	case "map":
		c, err := rs.resolve(w.items, r.items, path+"{}")
		if err != nil {
			return nil, err
		}
		return func(x any) (any, error) {
			xs, ok := x.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%w: %s: unexpected %T", ErrMalformed, path, x)
			}
			out := make(map[string]any, len(xs))
			for k, v := range xs {
				var err error
				if out[k], err = c(v); err != nil {
					return nil, err
				}
			}
			return out, nil
		}, nil
	}
	return primitive(w, r, path)
}

// sameKind tells whether a reader union branch is the writer's type
// itself, not a promotion.
func sameKind(w, r *schema) bool {
	if w.kind != r.kind {
		return false
	}
	if w.name != "" || r.name != "" {
		return namesMatch(w, r)
	}
	return true
}

func (rs *resolver) record(w, r *schema, path string) (convert, error) {
	key := [2]*schema{w, r}
	if c, ok := rs.seen[key]; ok {
		return func(x any) (any, error) { return (*c)(x) }, nil
	}
	var self convert
	rs.seen[key] = &self
	type step struct {
		from string // the writer's field name; "" for a default
		to   string
		conv convert
		def  any
	}
	steps := make([]step, 0, len(r.fields))
	for _, rf := range r.fields {
		var wf *field
		for _, f := range w.fields {
			if f.name == rf.name {
				wf = f
				break
			}
		}
		for _, a := range rf.aliases {
			if wf != nil {
				break
			}
			for _, f := range w.fields {
				if f.name == a {
					wf = f
					break
				}
			}
		}
		p := join(path, rf.name)
		if wf == nil {
			if !rf.hasDef {
				return nil, mismatch(p, "the writer's %s does not have it, and the reader's has no default", short(w.name))
			}
			def, err := defaultNative(rf.typ, rf.def)
			if err != nil {
				return nil, mismatch(p, "default: %v", err)
			}
			steps = append(steps, step{to: rf.name, def: def})
			continue
		}
		c, err := rs.resolve(wf.typ, rf.typ, p)
		if err != nil {
			return nil, err
		}
		steps = append(steps, step{from: wf.name, to: rf.name, conv: c})
	}
	self = func(x any) (any, error) {
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%w: %s: unexpected %T", ErrMalformed, path, x)
		}
		out := make(map[string]any, len(steps))
		for _, s := range steps {
			if s.from == "" {
				out[s.to] = s.def
				continue
			}
			v, err := s.conv(m[s.from])
			if err != nil {
				return nil, err
			}
			out[s.to] = v
		}
		return out, nil
	}
	return self, nil
}

func enumConvert(w, r *schema, path string) (convert, error) {
	known := make(map[string]bool, len(r.symbols))
	for _, s := range r.symbols {
		known[s] = true
	}
	for _, s := range w.symbols {
		if !known[s] && r.enumDef == "" {
			return nil, mismatch(path, "the writer's enum %s has the symbol %s, which the reader's lacks, and the reader's has no default", short(w.name), s)
		}
	}
	return func(x any) (any, error) {
		s, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("%w: %s: unexpected %T", ErrMalformed, path, x)
		}
		if !known[s] {
			return r.enumDef, nil
		}
		return s, nil
	}, nil
}

// primitive resolves two primitive types: the same, or a promotion.
func primitive(w, r *schema, path string) (convert, error) {
	fail := func() (convert, error) {
		return nil, mismatch(path, "the reader's %s cannot read the writer's %s", r.describe(), w.describe())
	}
	if !primitiveKinds[w.kind] {
		return fail()
	}
	wt, rt := w.logical == "timestamp-millis", r.logical == "timestamp-millis"
	switch {
	case w.kind == r.kind && wt == rt:
		return identity, nil
	case w.kind == "long" && r.kind == "long":
		if rt { // a plain long read as a timestamp
			return func(x any) (any, error) {
				n, _ := x.(int64)
				return time.UnixMilli(n).UTC(), nil
			}, nil
		}
		return func(x any) (any, error) {
			if t, ok := x.(time.Time); ok {
				return t.UnixMilli(), nil
			}
			return x, nil
		}, nil
	}
	switch w.kind + ">" + r.kind {
	case "int>long":
		return func(x any) (any, error) { n, _ := x.(int32); return int64(n), nil }, nil
	case "int>float":
		return func(x any) (any, error) { n, _ := x.(int32); return float32(n), nil }, nil
	case "int>double":
		return func(x any) (any, error) { n, _ := x.(int32); return float64(n), nil }, nil
	case "long>float":
		return func(x any) (any, error) { return float32(longOf(x)), nil }, nil
	case "long>double":
		return func(x any) (any, error) { return float64(longOf(x)), nil }, nil
	case "float>double":
		return func(x any) (any, error) { f, _ := x.(float32); return float64(f), nil }, nil
	case "string>bytes":
		return func(x any) (any, error) { s, _ := x.(string); return []byte(s), nil }, nil
	case "bytes>string":
		return func(x any) (any, error) { b, _ := x.([]byte); return string(b), nil }, nil
	}
	return fail()
}

func longOf(x any) int64 {
	switch n := x.(type) {
	case int64:
		return n
	case time.Time:
		return n.UnixMilli()
	}
	return 0
}

// CheckResolves returns nil when data written with the writer schema can
// be read with the reader schema, and otherwise a *SchemaMismatchError
// naming the first field that cannot (wrapped in ErrUnresolvableSchema); an
// unparsable schema is an error too.
func CheckResolves(writer, reader string) error {
	w, err := parseSchema(writer)
	if err != nil {
		return fmt.Errorf("writer: %w", err)
	}
	r, err := parseSchema(reader)
	if err != nil {
		return fmt.Errorf("reader: %w", err)
	}
	if _, err := resolveSchemas(w, r); err != nil {
		return fmt.Errorf("%w: %w", ErrUnresolvableSchema, err)
	}
	return nil
}
