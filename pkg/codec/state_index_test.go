package codec

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// indexOf is what DecodeStateIndex must return for a state DecodeState
// returned: the fields the store's index entries are named by.
func indexOf(st *task.State) StateIndex {
	x := StateIndex{TaskID: st.TaskID, ExpiresAt: st.ExpiresAt, Review: st.Review,
		ReviewDueAt: st.ReviewDueAt, ReviewAlerted: st.ReviewAlerted}
	if st.Pending != nil {
		x.Pending, x.Retry = true, *st.Pending
	}
	return x
}

// sameAsDecodeState fails t unless DecodeStateIndex accepts b exactly when
// DecodeState does, with the same error, and reads DecodeState's fields;
// it returns DecodeState's error.
func sameAsDecodeState(t *testing.T, c *Codec, b []byte) error {
	t.Helper()
	st, err := c.DecodeState(b)
	var x StateIndex
	xerr := c.DecodeStateIndex(b, &x)
	if (err == nil) != (xerr == nil) {
		t.Fatalf("% x:\nDecodeState error %v, DecodeStateIndex error %v", b, err, xerr)
	}
	if err != nil {
		if err.Error() != xerr.Error() {
			t.Fatalf("% x:\nDecodeState error %q, DecodeStateIndex error %q", b, err, xerr)
		}
		if x != (StateIndex{}) {
			t.Fatalf("% x: DecodeStateIndex failed (%v) but left %+v", b, xerr, x)
		}
		return err
	}
	if want := indexOf(st); x != want {
		t.Fatalf("% x:\nDecodeStateIndex read %+v\nDecodeState read      %+v", b, x, want)
	}
	// the walk takes every current-schema record the wire reader takes, not
	// leaving one to the slower fallback
	if c.ofCurrentState(b) {
		r := rd{b: b[headerLen:], view: true}
		d := nat{v: c.view}
		c.readState(&r, &d)
		wire := r.err == nil && len(r.b) == 0 && d.err == nil
		var y StateIndex
		if walk := c.walkStateIndex(b[headerLen:], &y); walk != wire {
			t.Fatalf("% x:\nthe walk accepts: %v, the wire reader: %v (%v, %v)", b, walk, wire, r.err, d.err)
		}
	}
	return nil
}

// stateSeeds are encoded states with each optional part present and absent,
// in every form DecodeState reads: the current schema (the fast walk), the
// JSON of earlier builds and TaskState v1.
func stateSeeds(t testing.TB, c *Codec) [][]byte {
	var out [][]byte
	enc := func(st *task.State) {
		b, err := c.EncodeState(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	enc(sampleState())
	enc(benchState(7))
	enc(&task.State{TaskID: "t"})
	enc(&task.State{})
	for _, review := range []string{task.ReviewNone, task.ReviewOpen, task.ReviewApproved, task.ReviewRejected, task.ReviewResolved, "SOMETHING_ELSE"} {
		st := sampleState()
		st.Review, st.ReviewAlerted = review, review == task.ReviewOpen
		enc(st)
	}
	min := minimalEvent()
	for _, st := range []*task.State{
		{TaskID: "pending", Pending: &task.PendingRetry{N: 3, DelayMs: 2000, NotBefore: 1_700_000_000_000}},
		{TaskID: "held", Pending: &task.PendingRetry{N: 1, DelayMs: -1, NotBefore: -5, DueAt: 1 << 50}, ExpiresAt: -1},
		{TaskID: "minimal-event", LastEvent: &min},
		{TaskID: "overdue", Review: task.ReviewOpen, ReviewDueAt: 1_700_000_000_000, ExpiresAt: 1_800_000_000_000},
	} {
		enc(st)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 40 {
		st := randomState(rng)
		st.Review = []string{task.ReviewNone, task.ReviewOpen, task.ReviewApproved, "x"}[rng.IntN(4)]
		if st.LastEvent != nil && st.LastEvent.Validate() != nil {
			continue
		}
		enc(st)
	}
	// the JSON form of earlier builds
	for _, st := range []*task.State{sampleState(), benchState(8), {TaskID: "j"}} {
		j, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	// TaskState v1 (no pending.due_at): read through goavro
	out = append(out, stateV1(t, c, sampleState()))
	return out
}

// stateV1 writes st (its pending retry without due_at) as TaskState v1.
func stateV1(t testing.TB, c *Codec, st *task.State) []byte {
	var v1 *writer
	for _, w := range c.writers {
		if w.name == c.state.name && w.version == 1 {
			v1 = w
		}
	}
	if v1 == nil {
		t.Fatal("TaskState v1 is not accepted")
	}
	cur, err := c.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	m, err := body(cur, c.state)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := m["pending"].(map[string]any); ok {
		delete(p["faultrouter.PendingRetry"].(map[string]any), "due_at")
	}
	old, err := encode(nil, v1, m)
	if err != nil {
		t.Fatal(err)
	}
	return old
}

// benchState is a state like those of `make bench` in the changelog: three
// seen events, retries by class, an operation, an open review with its
// owner and due time, and the latest event whole (error, usage, input_ref,
// sla, attributes).
func benchState(i int) *task.State {
	id := fmt.Sprintf("bench-%08d", i)
	sla := int64(6 * 3600 * 1000)
	at := int64(1_764_556_800_000) + int64(i)
	e := event.TaskEvent{
		EventID: id + "-a3", TaskID: id, Attempt: 3, OccurredAt: event.FromMillis(at + 3000),
		Source: "support-bot", Action: "refund", Provider: "openai", Model: "gpt-4o-mini", PromptTemplate: "tmpl-17-v3",
		Stage: event.StageBusiness, Status: event.StatusError,
		Error:    &event.Error{Type: "BusinessRuleError", HTTPStatus: 422, Code: "CODE_2101", Message: "amount must be positive"},
		Usage:    event.Usage{CostUSD: 0.0031, Tokens: 612, ElapsedMs: 2300},
		InputRef: &event.InputRef{URI: "s3://tickets/" + id + ".json", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", SizeBytes: 23456},
		SLAMs:    &sla, Attributes: map[string]string{"tenant": "tenant-7"},
	}
	return &task.State{
		TaskID: id, SeenEvents: []string{id + "-a1", id + "-a2", id + "-a3"}, Attempts: 3, Retries: 2,
		RetriesByClass: map[event.Class]int32{event.ClassNetworkTimeout: 1, event.ClassRateLimited: 1},
		CostUSD:        0.0093, Tokens: 1836, ElapsedMs: 6900,
		Operations: []task.Operation{{OpID: "op-" + id, Kind: event.OpWrite, ParamsSHA256: "ab12cd34", State: event.OpUnknown}},
		Review:     task.ReviewOpen, ReviewClass: event.ClassBusinessRejected, ReviewOwner: "operations", ReviewDueAt: at + 3_600_000,
		Terminal: true, TerminalClass: event.ClassBusinessRejected, LastClass: event.ClassBusinessRejected, LastRoute: event.RouteReview,
		FirstEventAt: at, LastEventAt: at + 3000, LastSeenAt: at + 3010, SLAMs: sla, ExpiresAt: at + 7*24*3_600_000,
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", LastEvent: &e,
	}
}

// FuzzStateIndex guards the restore's reader of the state changelog:
// for any bytes, DecodeStateIndex fails exactly when DecodeState fails (the
// restore skips such a record rather than storing it), with the same error,
// and otherwise reads the index fields of the state DecodeState returns.
func FuzzStateIndex(f *testing.F) {
	c := newCodec(f)
	for _, s := range stateSeeds(f, c) {
		f.Add(s)
		f.Add(s[:len(s)/2])              // truncated
		f.Add(append(bytes.Clone(s), 0)) // trailing byte
	}
	f.Add([]byte{})
	f.Add([]byte{0xC3, 0x01})
	f.Add([]byte("{not json"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sameAsDecodeState(t, c, b)
	})
}

// TestStateIndexRejects guards the restore against a corrupt changelog
// record: each kind of damage to a current-schema state, in its own fields
// or inside the embedded last_event, is rejected by DecodeStateIndex as it
// is by DecodeState, and the intact record is read by the walk, not by the
// fallback.
func TestStateIndexRejects(t *testing.T) {
	c := newCodec(t)
	// last_event ends with sla_ms null and no attributes, and the state
	// with no last_event_truncated and last_input null: the last four bytes
	// are those union indexes and block ends, all 0
	state := func() *task.State {
		s := benchState(1)
		s.LastEvent.Output = &event.Output{SchemaValid: ptr(false)}
		s.LastEvent.SLAMs, s.LastEvent.Attributes = nil, nil
		s.LastEvent.Operation = &event.Operation{OpID: "op", Kind: event.OpWrite, State: event.OpUnknown}
		return s
	}
	st := state()
	good, err := c.EncodeState(nil, st)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(good, []byte{0, 0, 0, 0}) {
		t.Fatalf("state ends with % x", good[len(good)-4:])
	}

	var x StateIndex
	if !c.walkStateIndex(good[headerLen:], &x) || x != indexOf(st) {
		t.Fatalf("the walk rejects or misreads a good state: %+v", x)
	}
	if sameAsDecodeState(t, c, good) != nil {
		t.Fatal("a good state is rejected")
	}

	// byteOf returns the one byte where the encodings of good and of the
	// state as edit changes it differ.
	byteOf := func(edit func(*task.State)) int {
		t.Helper()
		s := state()
		edit(s)
		b, err := c.EncodeState(nil, s)
		if err != nil || len(b) != len(good) {
			t.Fatalf("edited state: %v, %d bytes against %d", err, len(b), len(good))
		}
		at := -1
		for i := range b {
			if b[i] != good[i] {
				if at >= 0 {
					t.Fatalf("edited state differs at %d and %d", at, i)
				}
				at = i
			}
		}
		if at < 0 {
			t.Fatal("edited state is the same")
		}
		return at
	}
	set := func(at int, v ...byte) []byte {
		b := bytes.Clone(good)
		copy(b[at:], v)
		return b
	}
	alerted := byteOf(func(s *task.State) { s.ReviewAlerted = true })
	terminal := byteOf(func(s *task.State) { s.Terminal = false })
	schemaValid := byteOf(func(s *task.State) { *s.LastEvent.Output.SchemaValid = true })
	status := byteOf(func(s *task.State) { s.LastEvent.Status = event.StatusOK })
	stage := byteOf(func(s *task.State) { s.LastEvent.Stage = event.StageNetwork })
	opKind := byteOf(func(s *task.State) { s.LastEvent.Operation.Kind = event.OpGenerate })
	opState := byteOf(func(s *task.State) { s.LastEvent.Operation.State = event.OpPlanned })
	// an enum index one past the last symbol (all enums here have under 64)
	past := func(syms []string) byte { return byte(2 * len(syms)) }
	// traceparent (55 bytes: a one-byte length) sits between pending's
	// union index and last_event's
	tp := bytes.Index(good, []byte(st.Traceparent))
	if tp < 0 || good[tp-1] != 110 || good[tp-2] != 0 || good[tp+len(st.Traceparent)] != 2 {
		t.Fatalf("traceparent not found where expected at %d", tp)
	}
	pending, lastEvent := tp-2, tp+len(st.Traceparent)

	late := state()
	late.LastEvent.OccurredAt = event.FromMillis(maxMillis + 1) // the year 10000
	lateB, err := c.EncodeState(nil, late)
	if err != nil {
		t.Fatal(err)
	}
	hugeSeen := append(appendString(bytes.Clone(good[:headerLen]), st.TaskID), binary.AppendVarint(nil, maxBlockCount+1)...)
	hugeSeen = append(hugeSeen, good[len(hugeSeen):]...)
	hugeTruncated := append(binary.AppendVarint(bytes.Clone(good[:len(good)-2]), maxBlockCount+1), 0, 0)

	cases := []struct {
		name string
		b    []byte
	}{
		{"review_alerted byte 2", set(alerted, 2)},
		{"terminal byte 0xff", set(terminal, 0xff)},
		{"last_event.output.schema_valid byte 3", set(schemaValid, 3)},
		{"last_event.status enum index past the symbols", set(status, 0x7e)},
		{"last_event.status enum index negative", set(status, 0x01)},
		{"last_event.stage enum index past the symbols", set(stage, 0x40)},
		{"last_event.stage enum index one past the last symbol", set(stage, past(c.event.stage))},
		{"last_event.status enum index one past the last symbol", set(status, past(c.event.status))},
		{"last_event.operation.kind enum index one past the last symbol", set(opKind, past(c.event.opKind))},
		{"last_event.operation.state enum index one past the last symbol", set(opState, past(c.event.opState))},
		{"traceparent length negative (-56; 55 if read unsigned)", set(tp-1, 111)},
		{"last_event.stage union index 2", set(stage-1, 0x04)},
		{"last_event.stage union index -1", set(stage-1, 0x01)},
		{"last_event.sla_ms union index 2", set(len(good)-4, 0x04)},
		{"last_event union index 2", set(lastEvent, 0x04)},
		{"pending union index 3", set(pending, 0x06)},
		{"last_input union index 2", set(len(good)-1, 0x04)},
		{"last_event_truncated block count over the limit", hugeTruncated},
		{"seen block count over the limit", hugeSeen},
		{"task_id length negative", set(headerLen, 0x01)},
		{"task_id length past the end", set(headerLen, 0xfe, 0xff, 0x03)},
		{"last_event.occurred_at in the year 10000", lateB},
		{"trailing zero byte", append(bytes.Clone(good), 0)},
		{"trailing bytes", append(bytes.Clone(good), "xyz"...)},
		{"header only", bytes.Clone(good[:headerLen])},
		{"unknown fingerprint", set(2, 0x01, 0x02)},
		{"not single-object", set(0, 0xC2)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if bytes.Equal(tc.b, good) {
				t.Fatal("the case did not change the record")
			}
			if sameAsDecodeState(t, c, tc.b) == nil {
				t.Fatalf("accepted by both: % x", tc.b)
			}
		})
	}
	// a block of exactly maxBlockCount items is read, one more is not,
	// whether the block gives its count as positive or negative (with a
	// byte size)
	noSeen := state()
	noSeen.SeenEvents = nil
	bare, err := c.EncodeState(nil, noSeen)
	if err != nil {
		t.Fatal(err)
	}
	at := len(appendString(bytes.Clone(good[:headerLen]), st.TaskID)) // seen's first block
	if bare[at] != 0 {
		t.Fatalf("no seen block at %d", at)
	}
	for _, n := range []int{maxBlockCount, maxBlockCount + 1} {
		for _, negative := range []bool{false, true} {
			b := bytes.Clone(bare[:at])
			if negative {
				b = binary.AppendVarint(binary.AppendVarint(b, -int64(n)), int64(n))
			} else {
				b = binary.AppendVarint(b, int64(n))
			}
			b = append(b, make([]byte, n)...) // n empty strings
			b = append(b, bare[at:]...)       // the end of the array, the rest
			err := sameAsDecodeState(t, c, b)
			if (err == nil) != (n <= maxBlockCount) {
				t.Errorf("a block of %d seen events (negative count %v): error %v", n, negative, err)
			}
		}
	}

	// every truncation
	for n := range len(good) {
		if sameAsDecodeState(t, c, good[:n]) == nil {
			t.Fatalf("state cut to %d of %d bytes accepted", n, len(good))
		}
	}
}

// TestStateIndexAllocs guards the point of DecodeStateIndex: reading a
// current-schema state with every part set (pending, operations, review,
// last_event whole, last_input) allocates nothing.
func TestStateIndexAllocs(t *testing.T) {
	c := newCodec(t)
	if !c.stateWalk {
		t.Fatal("the TaskState walk disagrees with the wire reader on this build's schema")
	}
	for _, st := range []*task.State{sampleState(), benchState(3)} {
		b, err := c.EncodeState(nil, st)
		if err != nil {
			t.Fatal(err)
		}
		var x StateIndex
		allocs := testing.AllocsPerRun(200, func() {
			if err := c.DecodeStateIndex(b, &x); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("DecodeStateIndex allocates %v times per state", allocs)
		}
		if x != indexOf(st) {
			t.Fatalf("read %+v, want %+v", x, indexOf(st))
		}
	}
}

// BenchmarkDecodeStateIndex measures the restore's read of one changelog
// record, a state like those `make bench` writes, by DecodeStateIndex
// (ns/op), and reports it against DecodeStateView, the full decode it
// replaces, timed in the same process over the same records in alternating
// rounds (so that both see the same load on a shared machine): view-ns and
// index-ns per state, and view/index, how many times faster the index read
// is.
//
//	go test -run='^$' -bench=DecodeStateIndex ./pkg/codec
func BenchmarkDecodeStateIndex(b *testing.B) {
	c := newCodec(b)
	recs := make([][]byte, 64)
	size := 0
	for i := range recs {
		st := benchState(i)
		if i%2 == 1 {
			st.Operations = nil
		}
		if i%3 == 0 { // a pending retry instead of a review
			st.Review, st.ReviewClass, st.ReviewOwner, st.ReviewDueAt = "", "", "", 0
			st.Pending = &task.PendingRetry{N: 2, DelayMs: 4000, NotBefore: st.LastEventAt + 4000}
		}
		var err error
		if recs[i], err = c.EncodeState(nil, st); err != nil {
			b.Fatal(err)
		}
		size += len(recs[i])
	}
	var x StateIndex
	index := func(n int) time.Duration {
		start := time.Now()
		for i := range n {
			if err := c.DecodeStateIndex(recs[i%len(recs)], &x); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	view := func(n int) time.Duration {
		start := time.Now()
		for i := range n {
			if _, err := c.DecodeStateView(recs[i%len(recs)]); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	b.SetBytes(int64(size / len(recs)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := c.DecodeStateIndex(recs[n%len(recs)], &x); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.StopTimer()
	const rounds = 20
	chunk := max(n/rounds, 1000)
	var v, i time.Duration
	for range rounds {
		v += view(chunk)
		i += index(chunk)
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(rounds*chunk) }
	b.ReportMetric(per(v), "view-ns/state")
	b.ReportMetric(per(i), "index-ns/state")
	b.ReportMetric(float64(v)/float64(i), "view/index")
}
