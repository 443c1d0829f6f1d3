package codec

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// view is the reader's side of schema resolution: the enum symbols it knows
// and the TaskEvent fields it has. goavro decodes a body with its writer
// schema only; the mapping onto Go values consults the view, so a reader
// ignores what it does not know and defaults what the writer did not send.
type view struct {
	enums map[string]enumSet // by full name
	// dropTaskEvent clears the TaskEvent fields the reader's schema lacks.
	dropTaskEvent []func(*event.TaskEvent)
}

type enumSet struct {
	symbols map[string]bool
	def     string // "" when the enum has no default
}

// newView builds the view of the reader schemas; the first is the TaskEvent.
func newView(schemas []string) (*view, error) {
	v := &view{enums: map[string]enumSet{}}
	for i, s := range schemas {
		var root any
		if err := json.Unmarshal([]byte(s), &root); err != nil {
			return nil, fmt.Errorf("codec: reader schema: %w", err)
		}
		paths := map[string]bool{}
		v.walk(root, "", paths)
		if i == 0 {
			for _, f := range taskEventFields {
				if !paths[f.path] {
					v.dropTaskEvent = append(v.dropTaskEvent, f.drop)
				}
			}
		}
	}
	return v, nil
}

// walk collects enum sets and the field paths of records under prefix.
func (v *view) walk(t any, prefix string, paths map[string]bool) {
	switch t := t.(type) {
	case []any:
		for _, b := range t {
			v.walk(b, prefix, paths)
		}
	case map[string]any:
		switch t["type"] {
		case "record":
			fields, _ := t["fields"].([]any)
			for _, f := range fields {
				fm, _ := f.(map[string]any)
				name, _ := fm["name"].(string)
				p := prefix + name
				paths[p] = true
				v.walk(fm["type"], p+".", paths)
			}
		case "enum":
			full, _ := t["name"].(string)
			if ns, _ := t["namespace"].(string); ns != "" {
				full = ns + "." + full
			} else {
				full = "faultrouter." + full
			}
			if _, seen := v.enums[full]; seen {
				return
			}
			set := enumSet{symbols: map[string]bool{}}
			syms, _ := t["symbols"].([]any)
			for _, s := range syms {
				if s, ok := s.(string); ok {
					set.symbols[s] = true
				}
			}
			set.def, _ = t["default"].(string)
			v.enums[full] = set
		}
	}
}

// nat reads goavro native values into Go values, keeping the first error.
// A missing field reads as its zero value, which is every field's default.
type nat struct {
	v   *view
	err error
}

func (d *nat) fail(field string, got any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: field %s: unexpected %T", ErrMalformed, field, got)
	}
}

// union returns the value of a ["null", T] union field: nil for null.
func (d *nat) union(m map[string]any, k string) any {
	u, ok := m[k]
	if !ok || u == nil {
		return nil
	}
	if um, ok := u.(map[string]any); ok && len(um) == 1 {
		for _, x := range um {
			return x
		}
	}
	d.fail(k, u)
	return nil
}

func (d *nat) str(m map[string]any, k string) string    { return d.asStr(k, m[k]) }
func (d *nat) optStr(m map[string]any, k string) string { return d.asStr(k, d.union(m, k)) }

func (d *nat) asStr(k string, x any) string {
	switch s := x.(type) {
	case string:
		return s
	case nil:
		return ""
	}
	d.fail(k, x)
	return ""
}

func (d *nat) i32(m map[string]any, k string) int32 { return d.asI32(k, m[k]) }
func (d *nat) optI32(m map[string]any, k string) int32 {
	return d.asI32(k, d.union(m, k))
}

func (d *nat) asI32(k string, x any) int32 {
	switch n := x.(type) {
	case int32:
		return n
	case nil:
		return 0
	}
	d.fail(k, x)
	return 0
}

func (d *nat) i64(m map[string]any, k string) int64 { return d.asI64(k, m[k]) }

func (d *nat) asI64(k string, x any) int64 {
	switch n := x.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	case nil:
		return 0
	}
	d.fail(k, x)
	return 0
}

func (d *nat) optI64(m map[string]any, k string) *int64 {
	x := d.union(m, k)
	if x == nil {
		return nil
	}
	n := d.asI64(k, x)
	return &n
}

func (d *nat) f64(m map[string]any, k string) float64 {
	switch n := m[k].(type) {
	case float64:
		return n
	case nil:
		return 0
	}
	d.fail(k, m[k])
	return 0
}

func (d *nat) optF64(m map[string]any, k string) *float64 {
	x := d.union(m, k)
	if x == nil {
		return nil
	}
	f, ok := x.(float64)
	if !ok {
		d.fail(k, x)
		return nil
	}
	return &f
}

func (d *nat) boolean(m map[string]any, k string) bool {
	switch b := m[k].(type) {
	case bool:
		return b
	case nil:
		return false
	}
	d.fail(k, m[k])
	return false
}

func (d *nat) optBool(m map[string]any, k string) *bool {
	x := d.union(m, k)
	if x == nil {
		return nil
	}
	b, ok := x.(bool)
	if !ok {
		d.fail(k, x)
		return nil
	}
	return &b
}

// The range of a timestamp that RFC 3339 (the JSON form) can carry.
const (
	minMillis = -62135596800000 // 0001-01-01T00:00:00Z
	maxMillis = 253402300799999 // 9999-12-31T23:59:59.999Z
)

// ts reads a timestamp-millis; 0 reads as the zero Timestamp, the inverse of
// Timestamp.Millis.
func (d *nat) ts(m map[string]any, k string) event.Timestamp {
	var ms int64
	switch t := m[k].(type) {
	case nil:
		return event.Timestamp{}
	case interface{ UnixMilli() int64 }: // time.Time
		ms = t.UnixMilli()
	case int64:
		ms = t
	default:
		d.fail(k, t)
	}
	return d.millisTS(k, ms)
}

// millisTS is the timestamp of field k at ms (0 reads as the zero Timestamp).
func (d *nat) millisTS(k string, ms int64) event.Timestamp {
	if ms == 0 {
		return event.Timestamp{}
	}
	if ms < minMillis || ms > maxMillis {
		if d.err == nil {
			d.err = fmt.Errorf("%w: %w", ErrInvalidRecord, &event.FieldError{Field: k, Msg: "timestamp outside the years 0001 to 9999"})
		}
		return event.Timestamp{}
	}
	if t := event.FromMillis(ms); !t.IsZero() {
		return t
	}
	return event.Timestamp{}
}

// record reads a record field; nil when absent.
func (d *nat) record(m map[string]any, k string) map[string]any {
	return d.asRecord(k, m[k])
}

// optRecord reads a ["null", record] field.
func (d *nat) optRecord(m map[string]any, k string) map[string]any {
	return d.asRecord(k, d.union(m, k))
}

func (d *nat) asRecord(k string, x any) map[string]any {
	switch r := x.(type) {
	case map[string]any:
		return r
	case nil:
		return nil
	}
	d.fail(k, x)
	return nil
}

// enum reads a symbol of the named enum; a symbol the reader does not know
// reads as the reader's default.
func (d *nat) enum(k, enum string, x any) string {
	s := d.asStr(k, x)
	if s == "" {
		return ""
	}
	set, ok := d.v.enums[enum]
	if !ok || set.symbols[s] {
		return s
	}
	if set.def != "" {
		return set.def
	}
	if d.err == nil {
		d.err = fmt.Errorf("%w: field %s: symbol %q is unknown to this reader and %s has no default", ErrInvalidRecord, k, s, enum)
	}
	return ""
}

// finite rejects NaN and infinities in amounts the router sums: a NaN cost
// would never exceed a budget.
func finite(field string, fs ...float64) error {
	for _, f := range fs {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("%w: %w", ErrInvalidRecord, &event.FieldError{Field: field, Msg: "must be a finite number"})
		}
	}
	return nil
}
