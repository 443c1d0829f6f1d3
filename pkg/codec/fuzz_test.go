package codec

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"testing"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/linkedin/goavro/v2"
)

// FuzzDecode guards the decoder's promise to the router: no input panics, and
// any record it accepts re-encodes and decodes to the same value.
// Crashers found by the fuzzer stay in testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	c := newCodec(f)
	full, min := fullEvent(), minimalEvent()
	routed := fullRouted()
	breaker := event.BreakerEvent{Scope: "TASK", Key: "k", Kind: "ALERT", Reason: "r", Class: event.ClassBudgetExhausted, Instance: "i", At: t0}
	review := event.ReviewDecision{TaskID: "t", Approve: true, Reason: "ok", Reviewer: "me", At: t0}
	var seeds [][]byte
	add := func(b []byte, err error) {
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	add(c.EncodeTaskEvent(nil, &full))
	add(c.EncodeTaskEvent(nil, &min))
	add(c.EncodeRouted(nil, &routed))
	add(c.EncodeRouted(nil, &event.Routed{Decision: event.Decision{Class: event.ClassInvalidInput, Route: event.RouteDeadLetter}}))
	add(c.EncodeBreakerEvent(nil, &breaker))
	add(c.EncodeReviewDecision(nil, &review))
	v1, _ := avro.Version(avro.TaskEvent, 1)
	gc, _ := goavro.NewCodec(v1.JSON)
	e := v1Event()
	add(specSingle(gc, taskEventNative(&e)))
	noTask := fullEvent()
	noTask.TaskID = ""
	add(goavroSingle(f, avro.TaskEvent, &noTask))
	nanCost := fullEvent()
	nanCost.Usage.CostUSD = math.NaN()
	add(goavroSingle(f, avro.TaskEvent, &nanCost))
	manyFlags := minimalEvent()
	manyFlags.Output = &event.Output{Flags: []string{"a", "b", "c"}}
	add(c.EncodeTaskEvent(nil, &manyFlags))
	for _, s := range seeds {
		f.Add(s)
		f.Add(s[:len(s)/2])              // truncated
		f.Add(append(bytes.Clone(s), 0)) // trailing byte
	}
	unknown := bytes.Clone(seeds[0])
	binary.LittleEndian.PutUint64(unknown[2:10], 1)
	f.Add(unknown)
	f.Add([]byte{})
	f.Add([]byte{0xC3, 0x01})
	f.Add([]byte("not avro at all"))

	f.Fuzz(func(t *testing.T, b []byte) {
		if v, err := c.Decode(b); err == nil {
			reencode(t, c, v)
		} else if Kind(err) == "error" {
			t.Fatalf("Decode error without a sentinel: %v", err)
		}
		e, err := c.DecodeTaskEvent(b)
		if err != nil {
			if Kind(err) == "error" {
				t.Fatalf("DecodeTaskEvent error without a sentinel: %v", err)
			}
			return
		}
		b2, err := c.EncodeTaskEvent(nil, &e)
		if err != nil {
			t.Fatalf("decoded event does not re-encode: %v\n%+v", err, e)
		}
		e2, err := c.DecodeTaskEvent(b2)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if !reflect.DeepEqual(e, e2) {
			t.Fatalf("round trip changed the event:\n%+v\n%+v", e, e2)
		}
	})
}

// reencode checks that a decoded record of any type encodes again and
// decodes to the same value.
func reencode(t *testing.T, c *Codec, v any) {
	t.Helper()
	enc := func(v any) []byte {
		var b []byte
		var err error
		switch v := v.(type) {
		case *event.TaskEvent:
			b, err = c.EncodeTaskEvent(nil, v)
		case *event.Routed:
			b, err = c.EncodeRouted(nil, v)
		case *event.BreakerEvent:
			b, err = c.EncodeBreakerEvent(nil, v)
		case *event.ReviewDecision:
			b, err = c.EncodeReviewDecision(nil, v)
		default:
			t.Fatalf("Decode returned %T", v)
		}
		if err != nil {
			t.Fatalf("decoded %T does not re-encode: %v", v, err)
		}
		return b
	}
	b2 := enc(v)
	v2, err := c.Decode(b2)
	if err != nil {
		t.Fatalf("re-encoded %T does not decode: %v", v, err)
	}
	if !reflect.DeepEqual(v, v2) {
		t.Fatalf("round trip changed the %T:\n%+v\n%+v", v, v, v2)
	}
}

// goavroSingle writes e with the current schema of name, bypassing the
// codec's validation: the bytes of a producer that does not validate.
func goavroSingle(t testing.TB, name string, e *event.TaskEvent) ([]byte, error) {
	s, err := avro.Current(name)
	if err != nil {
		return nil, err
	}
	gc, err := goavro.NewCodec(s.JSON)
	if err != nil {
		return nil, err
	}
	return specSingle(gc, taskEventNative(e))
}
