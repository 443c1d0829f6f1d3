package codec

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// randomState sets each field of a task state, or leaves it out, at random.
func randomState(rng *rand.Rand) *task.State {
	st := sampleState()
	if rng.IntN(2) == 0 {
		st.SeenEvents = nil
	}
	if rng.IntN(2) == 0 {
		st.RetriesByClass = nil
	}
	if rng.IntN(2) == 0 {
		st.RateLimitedAt = nil
	}
	if rng.IntN(2) == 0 {
		st.Operations = nil
	}
	if rng.IntN(2) == 0 {
		st.Pending = nil
	}
	if rng.IntN(2) == 0 {
		st.LastEvent = nil
	} else {
		e := randomEvent(rng)
		st.LastEvent = &e
	}
	if rng.IntN(2) == 0 {
		st.LastEventTruncated = nil
	}
	if rng.IntN(2) == 0 {
		st.LastInput = nil
	}
	st.Review, st.Terminal, st.ReviewAlerted = "", rng.IntN(2) == 0, rng.IntN(2) == 0
	st.Attempts, st.CostUSD, st.ExpiresAt = rng.Int32(), rng.Float64(), rng.Int64()
	return st
}

// TestStateWireMatchesGoavro guards the changelog's TaskState encoding: the
// hand-written writer writes goavro's bytes, and the hand-written reader and
// goavro's (the path of any other schema version) read back the state.
func TestStateWireMatchesGoavro(t *testing.T) {
	c := newCodec(t)
	if !c.stateWire {
		t.Fatal("the TaskState wire codec disagrees with goavro on this build's schema")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 1000 {
		st := randomState(rng)
		if st.LastEvent != nil && st.LastEvent.Validate() != nil {
			continue
		}
		want, err := c.encodeStateNative(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.EncodeState(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("state %d: wire\n%x\ngoavro\n%x", i, got, want)
		}
		back, err := c.DecodeState(got)
		if err != nil {
			t.Fatal(err)
		}
		m, err := body(got, c.state)
		if err != nil {
			t.Fatal(err)
		}
		d := nat{v: c.view}
		viaGoavro := c.stateFrom(&d, m)
		if d.err != nil {
			t.Fatal(d.err)
		}
		view, err := c.DecodeStateView(got)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, st) || !reflect.DeepEqual(viaGoavro, st) || !reflect.DeepEqual(view, st) {
			t.Fatalf("state %d: wrote %+v, wire read %+v, goavro read %+v, view %+v", i, st, back, viaGoavro, view)
		}
		// a view rejects what DecodeState rejects: every truncation
		cut := got[:headerLen+rng.IntN(len(got)-headerLen)]
		if _, err1 := c.DecodeState(cut); err1 != nil {
			if _, err2 := c.DecodeStateView(cut); err2 == nil {
				t.Fatalf("state %d cut to %d bytes: DecodeState fails (%v), DecodeStateView does not", i, len(cut), err1)
			}
		}
	}
}

// TestStateReadsJSON guards the restore of changelogs and state directories
// written before the state was Avro: a JSON state (task.State's JSON form,
// first byte '{') decodes to the same state as its Avro encoding, and bytes
// that are neither are an error, not a panic.
func TestStateReadsJSON(t *testing.T) {
	c := newCodec(t)
	st := sampleState()
	old, err := json.Marshal(st) // what earlier builds wrote
	if err != nil {
		t.Fatal(err)
	}
	if old[0] != '{' {
		t.Fatalf("JSON state starts with %q", old[0])
	}
	fromJSON, err := c.DecodeState(old)
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if v[0] != 0xC3 || v[1] != 0x01 {
		t.Fatalf("Avro state starts with % x", v[:2])
	}
	fromAvro, err := c.DecodeState(v)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromJSON, fromAvro) {
		t.Fatalf("JSON state read as %+v, Avro as %+v", fromJSON, fromAvro)
	}
	for _, bad := range [][]byte{nil, []byte("{not json"), v[:len(v)/2], append(bytes.Clone(v), 0)} {
		if _, err := c.DecodeState(bad); err == nil {
			t.Errorf("% x decoded without an error", bad)
		}
	}
	ev := fullEvent()
	te, _ := c.EncodeTaskEvent(nil, &ev)
	if _, err := c.DecodeState(te); err == nil {
		t.Error("a TaskEvent decoded as a task state")
	}
}

// TestStateSmallerThanJSON guards the point of the change: the Avro state of
// a typical task is smaller than its JSON form.
func TestStateSmallerThanJSON(t *testing.T) {
	c := newCodec(t)
	st := sampleState()
	st.LastEvent.Output.Text = "I'm sorry, but I can't help with that request."
	j, _ := json.Marshal(st)
	a, err := c.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) >= len(j) {
		t.Fatalf("Avro state %d bytes, JSON %d", len(a), len(j))
	}
	t.Logf("task state: Avro %d bytes, JSON %d bytes", len(a), len(j))
}

// TestStateReadsVersion1 guards the changelog across the TaskState change
// that added pending.due_at: a state written by a build of TaskState v1 (no
// due_at) still decodes, its pending retry whole and due_at at its default,
// 0 (the retry was never held).
func TestStateReadsVersion1(t *testing.T) {
	c := newCodec(t)
	var v1 *writer
	for _, w := range c.writers {
		if w.name == c.state.name && w.version == 1 {
			v1 = w
		}
	}
	if v1 == nil || c.state.version != 2 {
		t.Fatalf("want TaskState v1 accepted and v2 written, write v%d", c.state.version)
	}
	st := sampleState()
	cur, err := c.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	m, err := body(cur, c.state)
	if err != nil {
		t.Fatal(err)
	}
	p := m["pending"].(map[string]any)["faultrouter.PendingRetry"].(map[string]any)
	delete(p, "due_at")
	old, err := encode(nil, v1, m)
	if err != nil {
		t.Fatalf("encode as TaskState v1: %v", err)
	}
	back, err := c.DecodeState(old)
	if err != nil {
		t.Fatalf("decode a TaskState v1 record: %v", err)
	}
	want := sampleState()
	want.Pending.DueAt = 0
	if !reflect.DeepEqual(back, want) {
		t.Fatalf("TaskState v1 record read as\n%+v\nwant\n%+v", back, want)
	}
}

// TestStateFromInputEvent guards EncodeStateFrom: a state whose last event is
// a whole copy of an input event, written with the input's body copied, reads
// back as the same state EncodeState writes, and is the same bytes when the
// event has at most one attribute (a map's encoding order is free).
func TestStateFromInputEvent(t *testing.T) {
	c := newCodec(t)
	rng := rand.New(rand.NewPCG(5, 6))
	copied := 0
	for i := range 1000 {
		e := randomEvent(rng)
		raw, err := c.EncodeTaskEvent(nil, &e)
		if err != nil {
			continue // Validate refuses it
		}
		var in event.TaskEvent
		if err := c.DecodeTaskEventInto(raw, &in); err != nil {
			t.Fatal(err)
		}
		st := &task.State{TaskID: in.TaskID, Attempts: 1}
		st.SetLastEvent(&in)
		if len(st.LastEventTruncated) > 0 {
			continue // the router passes the input only for a whole copy
		}
		want, err := c.EncodeState(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.EncodeStateFrom(nil, st, raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(e.Attributes) <= 1 && !bytes.Equal(got, want) {
			t.Fatalf("event %d: state from the input\n%x\nencoded\n%x", i, got, want)
		}
		back, err := c.DecodeState(got)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back.LastEvent, st.LastEvent) {
			t.Fatalf("event %d: last event read back as %+v, want %+v", i, back.LastEvent, st.LastEvent)
		}
		copied++
	}
	if copied < 200 {
		t.Fatalf("only %d of 1000 events checked (want 200)", copied)
	}
}
