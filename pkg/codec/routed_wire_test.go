package codec

import (
	"bytes"
	"math"
	"os"
	"reflect"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// TestRoutedWireMatchesGoavro guards the hand-written RoutedRecord encoder:
// for every class and route, with and without each optional field, with the
// event's body copied from its input record or encoded afresh, it writes
// exactly the bytes goavro writes, and they decode back to the record.
func TestRoutedWireMatchesGoavro(t *testing.T) {
	c := newCodec(t)
	if c.wire == nil {
		t.Fatal("the RoutedRecord encoder disagrees with goavro on this build's schemas, so the router falls back to goavro")
	}
	full := fullEvent()
	one := fullEvent()
	one.Attributes = map[string]string{"tenant": "acme"}
	minimal := event.TaskEvent{EventID: "e", TaskID: "t", Attempt: 1, OccurredAt: event.FromMillis(1), Source: "s", Action: "a", Status: event.StatusOK}
	v1, err := NewWith(Options{TaskEventVersion: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []*event.TaskEvent{nil, &full, &one, &minimal} {
		var inputs [][]byte
		if ev != nil {
			cur, err := c.EncodeTaskEvent(nil, ev)
			if err != nil {
				t.Fatal(err)
			}
			old, err := v1.EncodeTaskEvent(nil, ev) // an older writer: its body cannot be copied
			if err != nil {
				t.Fatal(err)
			}
			inputs = [][]byte{nil, cur, old}
		} else {
			inputs = [][]byte{nil}
		}
		for _, class := range event.Classes {
			for _, route := range event.Routes {
				for i, d := range decisions(class, route) {
					r := event.Routed{Event: ev, Decision: d,
						Input: event.Source{Topic: "ingress", Partition: int32(i), Offset: int64(i) << 20, Timestamp: event.FromMillis(1_700_000_000_000 + int64(i))}}
					want, err := c.encodeRoutedNative(nil, &r)
					if err != nil {
						t.Fatal(err)
					}
					for k, in := range inputs {
						if ev != nil && k == 2 {
							// the v1 input lacks input_ref and sla_ms: the record
							// embeds the event as decoded from it
							dec, err := c.DecodeTaskEvent(in)
							if err != nil {
								t.Fatal(err)
							}
							r2 := r
							r2.Event = &dec
							if want, err = c.encodeRoutedNative(nil, &r2); err != nil {
								t.Fatal(err)
							}
							r = r2
						}
						got, err := c.EncodeRoutedFrom(nil, &r, in)
						if err != nil {
							t.Fatal(err)
						}
						// a map's entries are written in Go's random map order, so
						// bytes compare only for events with at most one attribute
						if (ev == nil || len(ev.Attributes) <= 1) && !bytes.Equal(got, want) {
							t.Fatalf("%s/%s decision %d, input %d: wire encoding\n%x\ndiffers from goavro's\n%x", class, route, i, k, got, want)
						}
						back, err := c.DecodeRouted(got)
						if err != nil {
							t.Fatal(err)
						}
						if !reflect.DeepEqual(back.Decision, r.Decision) || !reflect.DeepEqual(back.Input, r.Input) || !reflect.DeepEqual(back.Event, r.Event) {
							t.Fatalf("%s/%s decision %d: decoded %+v, want %+v", class, route, i, back, r)
						}
					}
				}
			}
		}
	}
}

func decisions(class event.Class, route event.Route) []event.Decision {
	at := event.FromMillis(1_700_000_000_500)
	return []event.Decision{
		{Class: class, Route: route, Rule: "r", Reason: "", DecidedAt: at},
		{Class: class, Route: route, Rule: "rule.x", Reason: "a reason, with ünïcode",
			Retry:    &event.RetryPlan{N: 3, DelayMs: 2000, NotBefore: event.FromMillis(1_700_000_002_500)},
			Totals:   event.Totals{Attempts: 7, Retries: 2, CostUSD: 0.125, Tokens: 3001, ElapsedMs: 31000},
			Review:   &event.Review{Owner: "ai_product", SLAMs: 259200000, Priority: "normal"},
			Feedback: "CODE_1003: total", SuggestedModel: "gpt-4o", UserMessage: "hold on", DecidedAt: at, Override: "acme.gpt-4o_refund"},
		{Class: class, Route: route, Totals: event.Totals{CostUSD: math.SmallestNonzeroFloat64, Tokens: math.MaxInt64, ElapsedMs: math.MinInt64}},
	}
}

// TestRoutedWireRejectsUnknownSymbols guards the encoder's errors: a class
// or route the schema does not have is an error, as it is for goavro.
func TestRoutedWireRejectsUnknownSymbols(t *testing.T) {
	c := newCodec(t)
	for _, d := range []event.Decision{{Class: "NOPE", Route: event.RouteReview}, {Class: event.ClassSucceeded, Route: "NOPE"}} {
		if _, err := c.EncodeRouted(nil, &event.Routed{Decision: d}); err == nil {
			t.Errorf("decision %+v encoded without an error", d)
		}
		if _, err := c.encodeRoutedNative(nil, &event.Routed{Decision: d}); err == nil {
			t.Errorf("goavro encoded decision %+v without an error", d)
		}
	}
}

// Guards WriterVersion: a RoutedRecord this build writes names version 3
// (the one with decision.override); bytes of an earlier build's version 1
// name version 1; bytes that are no single-object encoding are an error.
func TestWriterVersion(t *testing.T) {
	c := newCodec(t)
	b, err := c.EncodeRouted(nil, &routedSamples()[0])
	if err != nil {
		t.Fatal(err)
	}
	if name, v, err := c.WriterVersion(b); err != nil || name != "faultrouter.RoutedRecord" || v != 3 {
		t.Errorf("WriterVersion of a routed record written now: %s %d %v, want faultrouter.RoutedRecord 3", name, v, err)
	}
	old, err := os.ReadFile("testdata/legacy/routed_record.v1.bin")
	if err != nil {
		t.Fatal(err)
	}
	if name, v, err := c.WriterVersion(old); err != nil || name != "faultrouter.RoutedRecord" || v != 1 {
		t.Errorf("WriterVersion of an earlier build's routed record: %s %d %v, want faultrouter.RoutedRecord 1", name, v, err)
	}
	if _, _, err := c.WriterVersion([]byte("{}")); err == nil {
		t.Error("WriterVersion of JSON: no error")
	}
}
