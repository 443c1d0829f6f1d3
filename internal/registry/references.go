package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Bounds of a schema's references: a registry is trusted to answer, not to
// answer sensibly.
const (
	maxReferences     = 64
	maxReferenceDepth = 8
)

// inlineReferences returns the text of s with the named types its
// references define inlined at their first use, so that it reads as one
// self-contained schema: some serializers (Apicurio's) register the nested
// records of a schema as schemas of their own, referenced by name. An error
// is ErrUnavailable when the registry cannot be asked, else the record's.
func (r *Client) inlineReferences(ctx context.Context, s sr.Schema) (string, error) {
	defs := map[string]any{} // full name -> parsed schema
	seen := 0
	var collect func(refs []sr.SchemaReference, depth int) error
	collect = func(refs []sr.SchemaReference, depth int) error {
		if depth > maxReferenceDepth {
			return fmt.Errorf("%w: references nest deeper than %d", codec.ErrUnresolvableSchema, maxReferenceDepth)
		}
		for _, ref := range refs {
			if _, ok := defs[ref.Name]; ok {
				continue
			}
			if seen++; seen > maxReferences {
				return fmt.Errorf("%w: more than %d references", codec.ErrUnresolvableSchema, maxReferences)
			}
			ss, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
			if notFound(err) && r.reloading() {
				return fmt.Errorf("%w: reference %s (subject %s version %d): not found while the registry may still be reloading; asking again", ErrUnavailable, ref.Name, ref.Subject, ref.Version)
			}
			if notFound(err) {
				return fmt.Errorf("%w: reference %s (subject %s version %d): the registry does not know it", codec.ErrUnresolvableSchema, ref.Name, ref.Subject, ref.Version)
			}
			if err != nil {
				r.troubled()
				return unavailable(err)
			}
			var def any
			if err := json.Unmarshal([]byte(ss.Schema.Schema), &def); err != nil {
				return fmt.Errorf("%w: reference %s: not JSON: %v", codec.ErrUnresolvableSchema, ref.Name, err)
			}
			defs[ref.Name] = def
			if err := collect(ss.Schema.References, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := collect(s.References, 0); err != nil {
		return "", err
	}
	var root any
	if err := json.Unmarshal([]byte(s.Schema), &root); err != nil {
		return "", fmt.Errorf("%w: not JSON: %v", codec.ErrUnresolvableSchema, err)
	}
	in := inliner{defs: defs, defined: map[string]bool{}}
	out, err := json.Marshal(in.walk(root, "", 0))
	if err != nil {
		return "", err
	}
	return string(out), nil
}

// inliner replaces the first use of each referenced name with its
// definition; defined are the names already defined (or inlined).
type inliner struct {
	defs    map[string]any
	defined map[string]bool
}

func fullName(name, ns string) string {
	if strings.Contains(name, ".") || ns == "" {
		return name
	}
	return ns + "." + name
}

func (in *inliner) walk(t any, ns string, depth int) any {
	if depth > 64 {
		return t
	}
	switch t := t.(type) {
	case string:
		for _, name := range []string{fullName(t, ns), t} {
			if def, ok := in.defs[name]; ok && !in.defined[name] {
				in.defined[name] = true
				return in.walk(def, "", depth+1)
			}
		}
		return t
	case []any:
		out := make([]any, len(t))
		for i, b := range t {
			out[i] = in.walk(b, ns, depth+1)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, v := range t {
			out[k] = v
		}
		if name, ok := t["name"].(string); ok {
			if tns, ok := t["namespace"].(string); ok && !strings.Contains(name, ".") {
				ns = tns
			}
			full := fullName(name, ns)
			in.defined[full] = true
			if i := strings.LastIndexByte(full, '.'); i >= 0 {
				ns = full[:i]
			}
		}
		for _, k := range []string{"type", "items", "values"} {
			if v, ok := t[k]; ok {
				out[k] = in.walk(v, ns, depth+1)
			}
		}
		if fs, ok := t["fields"].([]any); ok {
			fields := make([]any, len(fs))
			for i, f := range fs {
				fm, ok := f.(map[string]any)
				if !ok {
					fields[i] = f
					continue
				}
				nf := make(map[string]any, len(fm))
				for k, v := range fm {
					nf[k] = v
				}
				nf["type"] = in.walk(fm["type"], ns, depth+1)
				fields[i] = nf
			}
			out["fields"] = fields
		}
		return out
	}
	return t
}
