package codec

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// goavroTaskEvent decodes b with goavro only: the authority the wire reader
// is compared with.
func goavroTaskEvent(c *Codec, b []byte) (event.TaskEvent, error) { return c.decodeTaskEventGoavro(b) }

// randomEvent sets each field of a TaskEvent, or leaves it out, at random.
func randomEvent(rng *rand.Rand) event.TaskEvent {
	s := func() string {
		if rng.IntN(3) == 0 {
			return ""
		}
		return string(rune('a'+rng.IntN(26))) + "é" + string(make([]byte, rng.IntN(3)))
	}
	e := event.TaskEvent{EventID: "e" + s(), TaskID: "t" + s(), Attempt: rng.Int32N(5) - 1,
		OccurredAt: event.FromMillis(rng.Int64N(4_000_000_000_000)), Source: s(), Action: s(),
		Provider: s(), Model: s(), PromptTemplate: s(), Status: event.Statuses[rng.IntN(2)],
		Usage: event.Usage{CostUSD: rng.Float64(), Tokens: rng.Int64() - math.MaxInt64/2, ElapsedMs: rng.Int64N(1 << 40)}}
	if rng.IntN(2) == 0 {
		e.Stage = event.Stages[rng.IntN(len(event.Stages))]
	}
	if rng.IntN(2) == 0 {
		e.Error = &event.Error{Type: s(), HTTPStatus: rng.Int32N(600) - 50, Code: s(), Message: s()}
		if rng.IntN(2) == 0 {
			v := rng.Int64N(100000) - 10
			e.Error.RetryAfterMs = &v
		}
	}
	if rng.IntN(2) == 0 {
		e.Output = &event.Output{Text: s()}
		if rng.IntN(2) == 0 {
			v := rng.IntN(2) == 0
			e.Output.SchemaValid = &v
		}
		if rng.IntN(2) == 0 {
			v := rng.Float64()
			e.Output.Confidence = &v
		}
		for range rng.IntN(4) {
			e.Output.Flags = append(e.Output.Flags, "f"+s())
		}
	}
	if rng.IntN(2) == 0 {
		e.Operation = &event.Operation{OpID: "op" + s(), Kind: event.OpKinds[rng.IntN(2)], ParamsSHA256: s(), State: event.OpStates[rng.IntN(len(event.OpStates))]}
	}
	if rng.IntN(2) == 0 {
		e.InputRef = &event.InputRef{URI: "u" + s(), SHA256: s(), SizeBytes: rng.Int64N(3) * 1000}
	}
	if rng.IntN(2) == 0 {
		v := rng.Int64N(1 << 35)
		e.SLAMs = &v
	}
	if rng.IntN(2) == 0 {
		e.Attributes = map[string]string{"k" + s(): s()}
	}
	return e
}

// TestEventWireMatchesGoavro guards the hand-written TaskEvent reader and
// writer: on random events that set and omit every field, they write
// goavro's bytes and read what goavro reads; DecodeTaskEventInto (the
// router's, whose strings share one copy of the body) reads the same into an
// event that held another, and what it read does not change when the record's
// bytes are reused.
func TestEventWireMatchesGoavro(t *testing.T) {
	c := newCodec(t)
	if c.event == nil {
		t.Fatal("the TaskEvent wire codec disagrees with goavro on this build's schema, so the router falls back to goavro")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var into event.TaskEvent
	for i := range 2000 {
		e := randomEvent(rng)
		want, err := goavroSingle(t, avro.TaskEvent, &e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.EncodeTaskEvent(nil, &e)
		if errors.Is(err, ErrInvalidRecord) {
			continue // Validate refuses it before either encoder runs
		}
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("event %d %+v: wire\n%x\ngoavro\n%x", i, e, got, want)
		}
		we, werr := c.DecodeTaskEvent(want)
		ge, gerr := goavroTaskEvent(c, want)
		if (werr == nil) != (gerr == nil) || !reflect.DeepEqual(we, ge) {
			t.Fatalf("event %d: wire read %+v (%v), goavro read %+v (%v)", i, we, werr, ge, gerr)
		}
		rec := bytes.Clone(want)
		ierr := c.DecodeTaskEventInto(rec, &into)
		if (ierr == nil) != (gerr == nil) || (ierr == nil && !reflect.DeepEqual(into, ge)) {
			t.Fatalf("event %d: DecodeTaskEventInto read %+v (%v), goavro read %+v (%v)", i, into, ierr, ge, gerr)
		}
		for j := range rec {
			rec[j] = 'x'
		}
		if ierr == nil && !reflect.DeepEqual(into, ge) {
			t.Fatalf("event %d: the event DecodeTaskEventInto read changed with the record's bytes: %+v", i, into)
		}
	}
}

// FuzzEventWire guards the reader against goavro on hostile bytes: the
// router's decode of any TaskEvent body accepts exactly what goavro accepts,
// with the same value.
func FuzzEventWire(f *testing.F) {
	c := newCodec(f)
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		e := randomEvent(rng)
		b, err := goavroSingle(f, avro.TaskEvent, &e)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[headerLen:])
	}
	hdr, err := c.EncodeTaskEvent(nil, &event.TaskEvent{EventID: "e", TaskID: "t", Attempt: 1, Status: event.StatusOK, Source: "s", Action: "a", OccurredAt: t0})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b := append(bytes.Clone(hdr[:headerLen]), body...)
		we, werr := c.DecodeTaskEvent(b)
		ge, gerr := goavroTaskEvent(c, b)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("wire error %v, goavro error %v", werr, gerr)
		}
		var into event.TaskEvent
		if ierr := c.DecodeTaskEventInto(b, &into); (ierr == nil) != (gerr == nil) || (ierr == nil && !reflect.DeepEqual(into, ge)) {
			t.Fatalf("DecodeTaskEventInto read %+v (%v), goavro read %+v (%v)", into, ierr, ge, gerr)
		}
		if werr != nil && werr.Error() != gerr.Error() {
			t.Fatalf("wire error %q, goavro error %q", werr, gerr)
		}
		if !reflect.DeepEqual(we, ge) {
			t.Fatalf("wire read %+v, goavro read %+v", we, ge)
		}
	})
}
