package codec

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/linkedin/goavro/v2"
)

// evolve returns the current TaskEvent schema text changed by edit, which
// gets the parsed schema's field list.
func evolve(t *testing.T, edit func(fields []any) []any) string {
	t.Helper()
	cur, err := avro.Current(avro.TaskEvent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(cur.JSON), &m); err != nil {
		t.Fatal(err)
	}
	m["fields"] = edit(m["fields"].([]any))
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func without(fields []any, name string) []any {
	var out []any
	for _, f := range fields {
		if f.(map[string]any)["name"] != name {
			out = append(out, f)
		}
	}
	return out
}

func retyped(fields []any, name string, typ any) []any {
	for _, f := range fields {
		if fm := f.(map[string]any); fm["name"] == name {
			fm["type"] = typ
		}
	}
	return fields
}

// TestForeignEvolvedSchemaReads guards reading a registry writer schema
// that is not one of the accepted ones: a worker's TaskEvent with a new
// optional field and without the optional provider reads as the event it
// carries, the new field skipped and provider at its default.
func TestForeignEvolvedSchemaReads(t *testing.T) {
	c := newCodec(t)
	text := evolve(t, func(fs []any) []any {
		fs = without(fs, "provider")
		return append(fs, map[string]any{"name": "priority", "type": []any{"null", "string"}, "default": nil})
	})
	f, err := c.Foreign(text)
	if err != nil {
		t.Fatal(err)
	}
	e := fullEvent()
	cur, _ := c.EncodeTaskEvent(nil, &e)
	native, _, err := c.taskEvent.codec.NativeFromBinary(cur[headerLen:])
	if err != nil {
		t.Fatal(err)
	}
	m := native.(map[string]any)
	delete(m, "provider")
	m["priority"] = map[string]any{"string": "high"}
	gc, err := goavro.NewCodec(text)
	if err != nil {
		t.Fatal(err)
	}
	body, err := gc.BinaryFromNative(nil, m)
	if err != nil {
		t.Fatal(err)
	}
	so, err := f.SingleObject(nil, body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.DecodeTaskEvent(so)
	if err != nil {
		t.Fatal(err)
	}
	want := e
	want.Provider = ""
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

// TestForeignSameSchemaKeepsBody guards the common case: a registry schema
// with the canonical form of an accepted one is not resolved, its body is
// kept byte for byte under the accepted schema's header.
func TestForeignSameSchemaKeepsBody(t *testing.T) {
	c := newCodec(t)
	cur, _ := avro.Current(avro.TaskEvent)
	f, err := c.Foreign(cur.JSON)
	if err != nil {
		t.Fatal(err)
	}
	e := fullEvent()
	so, _ := c.EncodeTaskEvent(nil, &e)
	conf := ToConfluent(append([]byte(nil), so...), 7)
	if id, ok := ConfluentID(conf); !ok || id != 7 || len(conf) != len(so)-5 {
		t.Fatalf("ToConfluent: id %d ok %v len %d", id, ok, len(conf))
	}
	back, err := f.SingleObject(nil, conf[ConfluentHeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	if string(back) != string(so) {
		t.Fatal("the single-object encoding differs from the original")
	}
}

// TestForeignUnresolvableNamesField guards the refusal of a registry schema
// the reader cannot read: the error wraps ErrUnresolvableSchema and names
// the field that breaks it.
func TestForeignUnresolvableNamesField(t *testing.T) {
	c := newCodec(t)
	for _, tc := range []struct {
		name, field string
		edit        func([]any) []any
	}{
		{"attempt as string", "attempt", func(fs []any) []any { return retyped(fs, "attempt", "string") }},
		{"no task_id", "task_id", func(fs []any) []any { return without(fs, "task_id") }},
		{"status symbol unknown", "status", func(fs []any) []any {
			return retyped(fs, "status", map[string]any{"type": "enum", "name": "Status", "symbols": []any{"OK", "ERROR", "MAYBE"}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Foreign(evolve(t, tc.edit))
			var me *SchemaMismatchError
			if !errors.Is(err, ErrUnresolvableSchema) || !errors.As(err, &me) || me.Path != tc.field {
				t.Fatalf("got %v, want an unresolvable schema naming %s", err, tc.field)
			}
			if Kind(err) != "unresolvable_schema" {
				t.Fatalf("kind %q", Kind(err))
			}
		})
	}
}

// TestResolvePromotions guards the Avro promotions a registry schema may
// use: an int written where the reader has a long, a non-union where the
// reader has a union.
func TestResolvePromotions(t *testing.T) {
	w := `{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"string"},{"name":"c","type":"float"}]}`
	r := `{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":["null","string"]},{"name":"c","type":"double"},{"name":"d","type":"int","default":3}]}`
	ws, _ := parseSchema(w)
	rs, _ := parseSchema(r)
	conv, err := resolveSchemas(ws, rs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := conv(map[string]any{"a": int32(1), "b": "x", "c": float32(0.5)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"a": int64(1), "b": map[string]any{"string": "x"}, "c": 0.5, "d": int32(3)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if err := CheckResolves(r, w); err == nil {
		t.Fatal("a long read as an int resolved")
	}
}

// schemaMap is a SchemaSource of fixed schemas.
type schemaMap map[uint32]*Foreign

func (m schemaMap) WriterSchema(id uint32) (*Foreign, error) {
	if f, ok := m[id]; ok {
		return f, nil
	}
	return nil, fmt.Errorf("%w: registry schema ID %d", ErrUnknownSchema, id)
}

// TestWithSchemasDecodes guards the readers of a topic (tail, replay, the
// console): with a SchemaSource every Decode method reads the Confluent wire
// format, and an ID the source does not know is unknown_schema; without
// one such a record is not_single_object, saying it needs a registry.
func TestWithSchemasDecodes(t *testing.T) {
	c := newCodec(t)
	cur, _ := avro.Current(avro.TaskEvent)
	f, err := c.Foreign(cur.JSON)
	if err != nil {
		t.Fatal(err)
	}
	e := fullEvent()
	so, _ := c.EncodeTaskEvent(nil, &e)
	conf := ToConfluent(append([]byte(nil), so...), 3)
	rc := c.WithSchemas(schemaMap{3: f})
	if got, err := rc.DecodeTaskEvent(conf); err != nil || !reflect.DeepEqual(got, e) {
		t.Fatalf("DecodeTaskEvent: %v %+v", err, got)
	}
	if v, err := rc.Decode(conf); err != nil || !reflect.DeepEqual(*v.(*event.TaskEvent), e) {
		t.Fatalf("Decode: %v %+v", err, v)
	}
	other := ToConfluent(append([]byte(nil), so...), 4)
	if _, err := rc.Decode(other); Kind(err) != "unknown_schema" {
		t.Fatalf("unknown ID: %v", err)
	}
	if _, err := c.Decode(conf); Kind(err) != "not_single_object" || !strings.Contains(err.Error(), "--registry-url") {
		t.Fatalf("without a registry: %v", err)
	}
}

// FuzzForeign guards the reading of schemas a registry hands out, which
// faultrouter does not control: any schema text and body are read or
// refused with an error, never a panic, and a refused schema is
// ErrUnresolvableSchema.
func FuzzForeign(f *testing.F) {
	cur, _ := avro.Current(avro.TaskEvent)
	f.Add(cur.JSON, []byte{})
	f.Add(`{"type":"record","name":"TaskEvent","fields":[{"name":"task_id","type":"string"},{"name":"x","type":{"type":"array","items":"TaskEvent"}}]}`, []byte{2, 'a', 0})
	f.Add(`{"type":"record","name":"ReviewDecision","namespace":"faultrouter","fields":[]}`, []byte{0})
	f.Add(`[`, []byte{1})
	c, err := New()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, text string, body []byte) {
		fr, err := c.Foreign(text)
		if err != nil {
			if !errors.Is(err, ErrUnresolvableSchema) {
				t.Fatalf("refused without ErrUnresolvableSchema: %v", err)
			}
			return
		}
		fr.SingleObject(nil, body)
	})
}

// TestForeignRefusesZeroWidthArrays guards the router's memory against a
// registry schema whose arrays hold items of no bytes: a few bytes of body
// would decode into millions of items.
func TestForeignRefusesZeroWidthArrays(t *testing.T) {
	c := newCodec(t)
	text := evolve(t, func(fs []any) []any {
		return append(fs, map[string]any{"name": "pad", "default": []any{},
			"type": map[string]any{"type": "array", "items": map[string]any{"type": "array", "items": "null"}}})
	})
	_, err := c.Foreign(text)
	var me *SchemaMismatchError
	if !errors.Is(err, ErrUnresolvableSchema) || !errors.As(err, &me) || me.Path != "pad[]" {
		t.Fatalf("got %v, want an unresolvable schema naming pad[]", err)
	}
}
