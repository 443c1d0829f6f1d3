package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"reflect"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// A RoutedRecord is written on the router's hot path, once for the audit
// topic and often once more for a routed topic, per input record. Its binary
// encoding is the concatenation of its fields' encodings, so it is written
// here directly: the event's body is copied from the input record it was
// decoded from (it is the same TaskEvent, written with the same schema), and
// only the decision and the input's coordinates are encoded. goavro stays the
// authority on the schema: New checks this encoder against goavro's on a full
// sample and falls back to goavro if the two differ (a schema edit this file
// does not know), and TestRoutedWireMatchesGoavro compares them on every
// class, route and optional field.

// routedWire encodes RoutedRecords of one schema version without goavro.
type routedWire struct {
	class map[event.Class]int64 // enum symbol -> index in the writer schema
	route map[event.Route]int64
	event *writer // the TaskEvent schema the RoutedRecord embeds
	plain bool    // version 2: no decision.override
}

// newRoutedWire reads the enum symbols of the RoutedRecord schema.
func newRoutedWire(routedJSON string, embedded *writer) (*routedWire, error) {
	var root any
	if err := json.Unmarshal([]byte(routedJSON), &root); err != nil {
		return nil, err
	}
	enums := map[string][]string{}
	collectEnums(root, enums)
	w := &routedWire{class: map[event.Class]int64{}, route: map[event.Route]int64{}, event: embedded}
	for i, s := range enums["Class"] {
		w.class[event.Class(s)] = int64(i)
	}
	for i, s := range enums["Route"] {
		w.route[event.Route(s)] = int64(i)
	}
	if len(w.class) == 0 || len(w.route) == 0 {
		return nil, fmt.Errorf("codec: RoutedRecord schema has no Class or Route enum")
	}
	return w, nil
}

func collectEnums(t any, out map[string][]string) {
	switch t := t.(type) {
	case []any:
		for _, x := range t {
			collectEnums(x, out)
		}
	case map[string]any:
		if t["type"] == "enum" {
			name, _ := t["name"].(string)
			syms, _ := t["symbols"].([]any)
			for _, s := range syms {
				if s, ok := s.(string); ok {
					out[name] = append(out[name], s)
				}
			}
			return
		}
		for _, k := range []string{"type", "fields", "items", "values"} {
			collectEnums(t[k], out)
		}
	}
}

// encode appends the body of a RoutedRecord to dst. eventBody is the Avro
// body of r.Event written with w.event's schema; nil when r.Event is nil.
func (w *routedWire) encode(dst []byte, r *event.Routed, eventBody []byte) ([]byte, error) {
	if r.Event == nil {
		dst = append(dst, 0) // union branch 0: null
	} else {
		dst = append(dst, 2) // union branch 1: TaskEvent (zig-zag 1)
		dst = append(dst, eventBody...)
	}
	d := &r.Decision
	class, ok := w.class[d.Class]
	if !ok {
		return dst, fmt.Errorf("codec: encode %s: decision.class: %q is not a symbol of the schema", "faultrouter.RoutedRecord", d.Class)
	}
	route, ok := w.route[d.Route]
	if !ok {
		return dst, fmt.Errorf("codec: encode %s: decision.route: %q is not a symbol of the schema", "faultrouter.RoutedRecord", d.Route)
	}
	dst = binary.AppendVarint(dst, class)
	dst = binary.AppendVarint(dst, route)
	dst = appendString(dst, d.Rule)
	dst = appendString(dst, d.Reason)
	if p := d.Retry; p != nil {
		dst = append(dst, 2)
		dst = binary.AppendVarint(dst, int64(p.N))
		dst = binary.AppendVarint(dst, p.DelayMs)
		dst = binary.AppendVarint(dst, p.NotBefore.Millis())
	} else {
		dst = append(dst, 0)
	}
	t := &d.Totals
	dst = binary.AppendVarint(dst, int64(t.Attempts))
	dst = binary.AppendVarint(dst, int64(t.Retries))
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(t.CostUSD))
	dst = binary.AppendVarint(dst, t.Tokens)
	dst = binary.AppendVarint(dst, t.ElapsedMs)
	if rv := d.Review; rv != nil {
		dst = append(dst, 2)
		dst = appendString(dst, rv.Owner)
		dst = binary.AppendVarint(dst, rv.SLAMs)
		dst = appendString(dst, rv.Priority)
	} else {
		dst = append(dst, 0)
	}
	dst = appendOptString(dst, d.Feedback)
	dst = appendOptString(dst, d.SuggestedModel)
	dst = appendOptString(dst, d.UserMessage)
	dst = binary.AppendVarint(dst, d.DecidedAt.Millis())
	if p := d.Prevented; p != nil {
		dst = append(dst, 2)
		dst = appendString(dst, p.Stop)
		dst = binary.AppendVarint(dst, int64(p.BaselineRetries))
		dst = binary.AppendVarint(dst, int64(p.Attempts))
		dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(p.USD))
	} else {
		dst = append(dst, 0)
	}
	if !w.plain {
		dst = appendOptString(dst, d.Override)
	}
	in := &r.Input
	dst = appendString(dst, in.Topic)
	dst = binary.AppendVarint(dst, int64(in.Partition))
	dst = binary.AppendVarint(dst, in.Offset)
	dst = binary.AppendVarint(dst, in.Timestamp.Millis())
	return dst, nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendVarint(dst, int64(len(s)))
	return append(dst, s...)
}

// appendOptString writes a ["null", "string"] union the way optString
// builds it for goavro: the empty string is null.
func appendOptString(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, 0)
	}
	return appendString(append(dst, 2), s)
}

// selfCheck encodes a sample that sets every field both ways and reports
// whether this encoder writes goavro's bytes.
func (c *Codec) routedWireAgrees() bool {
	for _, r := range routedSamples() {
		want, err1 := c.encodeRoutedNative(nil, &r)
		got, err2 := c.encodeRoutedWire(nil, &r, nil)
		if err1 != nil || err2 != nil || !bytes.Equal(want, got) {
			return false
		}
	}
	return true
}

// routedPlainAgrees reports whether records without an override, written
// with routedPlain, decode to what was written, and whether the encoder of
// routed_wire.go writes goavro's bytes for them.
func (c *Codec) routedPlainAgrees() bool {
	if c.routedPlain == nil {
		return false
	}
	for _, r := range routedSamples() {
		r.Decision.Override = ""
		r.Decision.Totals.CostUSD = 0.25 // DecodeRouted refuses the sample's infinity
		b, err := c.EncodeRouted(nil, &r)
		if err != nil {
			return false
		}
		if w, _ := c.writerOf(b); w != c.routedPlain {
			return false
		}
		if got, err := c.DecodeRouted(b); err != nil || !reflect.DeepEqual(got, r) {
			return false
		}
		if c.wirePlain != nil {
			want, err := c.encodeRoutedNative(nil, &r)
			if err != nil || !bytes.Equal(want, b) {
				return false
			}
		}
	}
	return true
}

// routedSamples are routed records that between them set every field of
// the RoutedRecord schema, and leave every optional one out.
func routedSamples() []event.Routed {
	sla, retryAfter := int64(60000), int64(1500)
	valid, conf := true, 0.5
	ev := event.TaskEvent{
		EventID: "e-1", TaskID: "t-1", Attempt: 2, OccurredAt: event.FromMillis(1_700_000_000_123),
		Source: "bot", Action: "refund", Provider: "openai", Model: "gpt-4o", PromptTemplate: "refund-v3",
		Stage: event.StageNetwork, Status: event.StatusError,
		Error:     &event.Error{Type: "TimeoutError", HTTPStatus: 504, Code: "c", Message: "m", RetryAfterMs: &retryAfter},
		Output:    &event.Output{Text: "t", SchemaValid: &valid, Confidence: &conf, Flags: []string{"a", "b"}},
		Usage:     event.Usage{CostUSD: 0.25, Tokens: 420, ElapsedMs: 30000},
		Operation: &event.Operation{OpID: "op", Kind: event.OpWrite, ParamsSHA256: "ab", State: event.OpUnknown},
		InputRef:  &event.InputRef{URI: "s3://x", SHA256: "cd", SizeBytes: 99},
		SLAMs:     &sla, Attributes: map[string]string{"k": "v"},
	}
	full := event.Routed{
		Event: &ev,
		Decision: event.Decision{
			Class: event.ClassNetworkTimeout, Route: event.RouteRetry, Rule: "network.retry", Reason: "why",
			Retry:    &event.RetryPlan{N: 2, DelayMs: -1, NotBefore: event.FromMillis(1_700_000_001_000)},
			Totals:   event.Totals{Attempts: 3, Retries: -2, CostUSD: math.Inf(1), Tokens: 1 << 40, ElapsedMs: -5},
			Review:   &event.Review{Owner: "security", SLAMs: 3600000, Priority: "high"},
			Feedback: "fb", SuggestedModel: "sm", UserMessage: "um", DecidedAt: event.FromMillis(1_700_000_002_000),
			Prevented: &event.Prevented{Stop: "budget", BaselineRetries: 3, Attempts: -2, USD: 1.25},
			Override:  "acme-timeouts",
		},
		Input: event.Source{Topic: "ai.tasks.ingress", Partition: 5, Offset: 1 << 33, Timestamp: event.FromMillis(1_700_000_000_000)},
	}
	empty := event.Routed{Decision: event.Decision{Class: event.ClassInvalidInput, Route: event.RouteDeadLetter}}
	return []event.Routed{full, empty}
}
