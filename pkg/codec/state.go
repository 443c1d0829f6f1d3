package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"slices"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// A task state is the value of the state changelog topic and of the router's
// Pebble store: a TaskState record (avro/task_state.avsc) in the single-object
// encoding. Builds before it wrote the JSON form of task.State (task.Marshal);
// DecodeState reads both, told apart by their first byte ('{' for JSON, the
// marker 0xC3 for Avro), so a changelog or a state directory written by such a
// build is still restored.
//
// The current TaskState schema is written and read here directly (like
// event_wire.go); another accepted version is read through goavro and mapped
// by field name (stateFrom), its missing fields taking their defaults.
// TestStateWireMatchesGoavro compares the two.

// EncodeState appends the single-object encoding of st to dst.
func (c *Codec) EncodeState(dst []byte, st *task.State) ([]byte, error) {
	return c.EncodeStateFrom(dst, st, nil)
}

// EncodeStateFrom is EncodeState for a state whose last event is a whole copy
// (nothing cut) of the event decoded from lastEvent, a single-object
// encoding; nil when there is none. When lastEvent was written with the
// TaskEvent schema the state embeds, its body is copied rather than the
// event encoded again (an Avro record's encoding is its fields' in order).
func (c *Codec) EncodeStateFrom(dst []byte, st *task.State, lastEvent []byte) ([]byte, error) {
	n := len(dst)
	if !c.stateWire {
		out, err := c.encodeStateNative(dst, st)
		if err != nil {
			return out, err
		}
		return c.asNextState(out, n), nil // state_release.go
	}
	out, err := c.appendStateFrom(header(dst, c.state), st, lastEvent)
	if err != nil {
		return dst[:n], err
	}
	return c.asNextState(out, n), nil
}

// DecodeState decodes a task state written by EncodeState, or the JSON form
// written by earlier builds.
func (c *Codec) DecodeState(b []byte) (*task.State, error) { return c.decodeState(b, false) }

// DecodeStateView is DecodeState without copying strings: the strings of
// the state it returns share b's bytes (those of the current schema's
// records; other forms are copied). b must not change while the state is
// used, and a string kept longer than b keeps all of b in memory. It
// accepts and rejects exactly what DecodeState does.
func (c *Codec) DecodeStateView(b []byte) (*task.State, error) { return c.decodeState(b, true) }

func (c *Codec) decodeState(b []byte, view bool) (*task.State, error) {
	if len(b) > 0 && b[0] == '{' {
		st, err := task.Unmarshal(b)
		if err != nil {
			return nil, fmt.Errorf("%w: JSON task state: %v", ErrMalformed, err)
		}
		return st, nil
	}
	w, err := c.writerOf(b)
	if err != nil {
		return nil, err
	}
	if w.name != avro.TaskState {
		return nil, fmt.Errorf("%w: want %s, got %s v%d", ErrWrongSchema, avro.TaskState, w.name, w.version)
	}
	if w == c.state && c.stateWire {
		r := rd{b: b[headerLen:], view: view}
		d := nat{v: c.view}
		st := c.readState(&r, &d)
		if r.err == nil && len(r.b) == 0 && d.err == nil {
			return st, nil
		}
		// goavro reads it again for its error
	}
	m, err := body(b, w)
	if err != nil {
		return nil, err
	}
	d := nat{v: c.view}
	st := c.stateFrom(&d, m)
	if d.err != nil {
		return nil, d.err
	}
	return st, nil
}

func (c *Codec) appendState(dst []byte, s *task.State) ([]byte, error) {
	return c.appendStateFrom(dst, s, nil)
}

// appendStateFrom is appendState with the encoding s.LastEvent was decoded
// from (EncodeStateFrom).
func (c *Codec) appendStateFrom(dst []byte, s *task.State, lastEvent []byte) ([]byte, error) {
	dst = appendString(dst, s.TaskID)
	dst = appendStrings(dst, s.SeenEvents)
	dst = binary.AppendVarint(dst, int64(s.Attempts))
	dst = binary.AppendVarint(dst, int64(s.Retries))
	if len(s.RetriesByClass) > 0 {
		var room [8]string // a task retries in few classes
		keys := room[:0]
		for k := range s.RetriesByClass {
			keys = append(keys, string(k))
		}
		slices.Sort(keys)
		dst = binary.AppendVarint(dst, int64(len(keys)))
		for _, k := range keys {
			dst = appendString(dst, k)
			dst = binary.AppendVarint(dst, int64(s.RetriesByClass[event.Class(k)]))
		}
	}
	dst = append(dst, 0)
	if len(s.RateLimitedAt) > 0 {
		dst = binary.AppendVarint(dst, int64(len(s.RateLimitedAt)))
		for _, t := range s.RateLimitedAt {
			dst = binary.AppendVarint(dst, t)
		}
	}
	dst = append(dst, 0)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(s.CostUSD))
	dst = binary.AppendVarint(dst, s.Tokens)
	dst = binary.AppendVarint(dst, s.ElapsedMs)
	if len(s.Operations) > 0 {
		dst = binary.AppendVarint(dst, int64(len(s.Operations)))
		for _, op := range s.Operations {
			dst = appendString(dst, op.OpID)
			dst = appendString(dst, string(op.Kind))
			dst = appendOptString(dst, op.ParamsSHA256)
			dst = appendString(dst, string(op.State))
		}
	}
	dst = append(dst, 0)
	dst = appendString(dst, s.Review)
	dst = appendString(dst, string(s.ReviewClass))
	dst = appendString(dst, s.ReviewOwner)
	dst = binary.AppendVarint(dst, s.ReviewDueAt)
	dst = appendBool(dst, s.ReviewAlerted)
	dst = appendBool(dst, s.Terminal)
	dst = appendString(dst, string(s.TerminalClass))
	dst = appendString(dst, string(s.LastClass))
	dst = appendString(dst, string(s.LastRoute))
	for _, v := range []int64{s.FirstEventAt, s.LastEventAt, s.LastSeenAt, s.SLAMs, s.ExpiresAt} {
		dst = binary.AppendVarint(dst, v)
	}
	if p := s.Pending; p != nil {
		dst = binary.AppendVarint(append(dst, 2), int64(p.N))
		dst = binary.AppendVarint(dst, p.DelayMs)
		dst = binary.AppendVarint(dst, p.NotBefore)
		dst = binary.AppendVarint(dst, p.DueAt)
	} else {
		dst = append(dst, 0)
	}
	dst = appendString(dst, s.Traceparent)
	if e := s.LastEvent; e != nil {
		if c.embedsEventOf(lastEvent) {
			dst = append(append(dst, 2), lastEvent[headerLen:]...)
		} else {
			var err error
			if dst, err = c.event.encode(append(dst, 2), e); err != nil {
				return dst, err
			}
		}
	} else {
		dst = append(dst, 0)
	}
	dst = appendStrings(dst, s.LastEventTruncated)
	if in := s.LastInput; in != nil {
		dst = appendString(append(dst, 2), in.Topic)
		dst = binary.AppendVarint(dst, int64(in.Partition))
		dst = binary.AppendVarint(dst, in.Offset)
		dst = binary.AppendVarint(dst, in.Timestamp.Millis())
	} else {
		dst = append(dst, 0)
	}
	return dst, nil
}

// embedsEventOf reports whether b, a single-object TaskEvent (or nil), was
// written with the TaskEvent schema a TaskState embeds, so that its body is
// the state's last_event as it is.
func (c *Codec) embedsEventOf(b []byte) bool {
	if b == nil || c.wire == nil {
		return false
	}
	w, err := c.writerOf(b)
	return err == nil && w == c.wire.event
}

// stateWireAgrees checks the TaskState reader and writer against goavro on
// a sample that sets every field.
func (c *Codec) stateWireAgrees() bool {
	st := sampleState()
	want, err := c.encodeStateNative(nil, st)
	if err != nil {
		return false
	}
	got, err := c.appendState(header(nil, c.state), st)
	if err != nil || string(got) != string(want) {
		return false
	}
	r := rd{b: got[headerLen:]}
	d := nat{v: c.view}
	back := c.readState(&r, &d)
	return r.err == nil && d.err == nil && len(r.b) == 0 && reflect.DeepEqual(back, st)
}

// sampleState sets every field of a State (maps with one entry: goavro
// writes a map in Go's random order).
func sampleState() *task.State {
	ev := routedSamples()[0].Event
	e := *ev
	e.Attributes = map[string]string{"k": "v"}
	return &task.State{
		TaskID: "t-1", SeenEvents: []string{"e-1", "e-2"}, Attempts: 2, Retries: 1,
		RetriesByClass: map[event.Class]int32{event.ClassNetworkTimeout: 1}, RateLimitedAt: []int64{1, -2},
		CostUSD: 0.5, Tokens: 300, ElapsedMs: 4000,
		Operations: []task.Operation{{OpID: "op", Kind: event.OpWrite, ParamsSHA256: "ab", State: event.OpUnknown}, {OpID: "op2", Kind: event.OpGenerate, State: event.OpPlanned}},
		Review:     task.ReviewOpen, ReviewClass: event.ClassModelRefusal, ReviewOwner: "ai_product", ReviewDueAt: 99, ReviewAlerted: true,
		Terminal: true, TerminalClass: event.ClassModelRefusal, LastClass: event.ClassModelRefusal, LastRoute: event.RouteReview,
		FirstEventAt: 1, LastEventAt: 2, LastSeenAt: 3, SLAMs: 4, ExpiresAt: 5,
		Pending:     &task.PendingRetry{N: 1, DelayMs: 1000, NotBefore: 6, DueAt: 2},
		Traceparent: "00-abc-def-01", LastEvent: &e, LastEventTruncated: []string{"output.text"},
		LastInput: &event.Source{Topic: "ai.tasks.ingress", Partition: 3, Offset: 77, Timestamp: event.FromMillis(1_700_000_000_000)},
	}
}

// fromMillis is the inverse of event.Timestamp.Millis: 0 is the zero time.
func fromMillis(ms int64) event.Timestamp {
	if ms == 0 {
		return event.Timestamp{}
	}
	return event.FromMillis(ms)
}

func appendStrings(dst []byte, ss []string) []byte {
	if len(ss) > 0 {
		dst = binary.AppendVarint(dst, int64(len(ss)))
		for _, s := range ss {
			dst = appendString(dst, s)
		}
	}
	return append(dst, 0)
}

func appendBool(dst []byte, b bool) []byte {
	if b {
		return append(dst, 1)
	}
	return append(dst, 0)
}

// readState reads a body of the current TaskState schema.
func (c *Codec) readState(r *rd, d *nat) *task.State {
	s := &task.State{}
	s.TaskID = r.str()
	r.blocks(func() { s.SeenEvents = append(s.SeenEvents, r.str()) })
	s.Attempts = r.int()
	s.Retries = r.int()
	r.blocks(func() {
		k := r.str()
		v := r.int()
		if s.RetriesByClass == nil {
			s.RetriesByClass = map[event.Class]int32{}
		}
		s.RetriesByClass[event.Class(k)] = v
	})
	r.blocks(func() { s.RateLimitedAt = append(s.RateLimitedAt, r.long()) })
	s.CostUSD = r.double()
	s.Tokens = r.long()
	s.ElapsedMs = r.long()
	r.blocks(func() {
		op := task.Operation{OpID: r.str(), Kind: event.OpKind(r.str()), ParamsSHA256: r.optStr(), State: event.OpState(r.str())}
		s.Operations = append(s.Operations, op)
	})
	s.Review = r.str()
	s.ReviewClass = event.Class(r.str())
	s.ReviewOwner = r.str()
	s.ReviewDueAt = r.long()
	s.ReviewAlerted = r.boolean()
	s.Terminal = r.boolean()
	s.TerminalClass = event.Class(r.str())
	s.LastClass = event.Class(r.str())
	s.LastRoute = event.Route(r.str())
	s.FirstEventAt = r.long()
	s.LastEventAt = r.long()
	s.LastSeenAt = r.long()
	s.SLAMs = r.long()
	s.ExpiresAt = r.long()
	if r.branch(2) == 1 {
		s.Pending = &task.PendingRetry{N: r.int(), DelayMs: r.long(), NotBefore: r.long(), DueAt: r.long()}
	}
	s.Traceparent = r.str()
	if r.branch(2) == 1 {
		e := &event.TaskEvent{}
		c.event.decode(r, d, e)
		s.LastEvent = e
	}
	r.blocks(func() { s.LastEventTruncated = append(s.LastEventTruncated, r.str()) })
	if r.branch(2) == 1 {
		in := &event.Source{Topic: r.str(), Partition: r.int(), Offset: r.long()}
		in.Timestamp = fromMillis(r.long())
		s.LastInput = in
	}
	return s
}

// stateFrom maps goavro's value of any TaskState version onto a State; a
// field the writer did not have keeps its zero value, every field's default.
func (c *Codec) stateFrom(d *nat, m map[string]any) *task.State {
	s := &task.State{
		TaskID: d.str(m, "task_id"), Attempts: d.i32(m, "attempts"), Retries: d.i32(m, "retries"),
		CostUSD: d.f64(m, "cost_usd"), Tokens: d.i64(m, "tokens"), ElapsedMs: d.i64(m, "elapsed_ms"),
		Review: d.str(m, "review"), ReviewClass: event.Class(d.str(m, "review_class")),
		ReviewOwner: d.str(m, "review_owner"), ReviewDueAt: d.i64(m, "review_due_at"),
		ReviewAlerted: d.boolean(m, "review_alerted"), Terminal: d.boolean(m, "terminal"),
		TerminalClass: event.Class(d.str(m, "terminal_class")), LastClass: event.Class(d.str(m, "last_class")),
		LastRoute: event.Route(d.str(m, "last_route")), FirstEventAt: d.i64(m, "first_event_at"),
		LastEventAt: d.i64(m, "last_event_at"), LastSeenAt: d.i64(m, "last_seen_at"),
		SLAMs: d.i64(m, "sla_ms"), ExpiresAt: d.i64(m, "expires_at"), Traceparent: d.str(m, "traceparent"),
	}
	s.SeenEvents = d.strs(m, "seen")
	s.LastEventTruncated = d.strs(m, "last_event_truncated")
	if xs, ok := m["rate_limited_at"].([]any); ok {
		for _, x := range xs {
			s.RateLimitedAt = append(s.RateLimitedAt, d.asI64("rate_limited_at", x))
		}
	}
	if rc, ok := m["retries_by_class"].(map[string]any); ok && len(rc) > 0 {
		s.RetriesByClass = make(map[event.Class]int32, len(rc))
		for k, v := range rc {
			s.RetriesByClass[event.Class(k)] = d.asI32("retries_by_class", v)
		}
	}
	if ops, ok := m["operations"].([]any); ok {
		for _, o := range ops {
			om := d.asRecord("operations", o)
			if om == nil {
				continue
			}
			s.Operations = append(s.Operations, task.Operation{OpID: d.str(om, "op_id"), Kind: event.OpKind(d.str(om, "kind")),
				ParamsSHA256: d.optStr(om, "params_sha256"), State: event.OpState(d.str(om, "state"))})
		}
	}
	if p := d.optRecord(m, "pending"); p != nil {
		s.Pending = &task.PendingRetry{N: d.i32(p, "n"), DelayMs: d.i64(p, "delay_ms"), NotBefore: d.i64(p, "not_before"),
			DueAt: d.i64(p, "due_at")}
	}
	if e := d.optRecord(m, "last_event"); e != nil {
		ev := c.taskEventFrom(d, e)
		s.LastEvent = &ev
	}
	if in := d.optRecord(m, "last_input"); in != nil {
		s.LastInput = &event.Source{Topic: d.str(in, "topic"), Partition: d.i32(in, "partition"), Offset: d.i64(in, "offset"),
			Timestamp: fromMillis(d.i64(in, "timestamp"))}
	}
	return s
}

func (d *nat) strs(m map[string]any, k string) []string {
	xs, ok := m[k].([]any)
	if !ok {
		if m[k] != nil {
			d.fail(k, m[k])
		}
		return nil
	}
	var out []string
	for _, x := range xs {
		out = append(out, d.asStr(k, x))
	}
	return out
}

// encodeStateNative encodes st with goavro: the authority the wire encoder
// is tested against, and the fallback when it disagrees with goavro.
func (c *Codec) encodeStateNative(dst []byte, s *task.State) ([]byte, error) {
	anys := func(ss []string) []any {
		out := make([]any, len(ss))
		for i, s := range ss {
			out[i] = s
		}
		return out
	}
	rl := make([]any, len(s.RateLimitedAt))
	for i, t := range s.RateLimitedAt {
		rl[i] = t
	}
	rc := make(map[string]any, len(s.RetriesByClass))
	for k, v := range s.RetriesByClass {
		rc[string(k)] = v
	}
	ops := make([]any, len(s.Operations))
	for i, op := range s.Operations {
		ops[i] = map[string]any{"op_id": op.OpID, "kind": string(op.Kind), "params_sha256": optString(op.ParamsSHA256), "state": string(op.State)}
	}
	m := map[string]any{
		"task_id": s.TaskID, "seen": anys(s.SeenEvents), "attempts": s.Attempts, "retries": s.Retries,
		"retries_by_class": rc, "rate_limited_at": rl, "cost_usd": s.CostUSD, "tokens": s.Tokens, "elapsed_ms": s.ElapsedMs,
		"operations": ops, "review": s.Review, "review_class": string(s.ReviewClass), "review_owner": s.ReviewOwner,
		"review_due_at": s.ReviewDueAt, "review_alerted": s.ReviewAlerted, "terminal": s.Terminal,
		"terminal_class": string(s.TerminalClass), "last_class": string(s.LastClass), "last_route": string(s.LastRoute),
		"first_event_at": s.FirstEventAt, "last_event_at": s.LastEventAt, "last_seen_at": s.LastSeenAt,
		"sla_ms": s.SLAMs, "expires_at": s.ExpiresAt, "pending": nil, "traceparent": s.Traceparent,
		"last_event": nil, "last_event_truncated": anys(s.LastEventTruncated), "last_input": nil,
	}
	if p := s.Pending; p != nil {
		m["pending"] = map[string]any{"faultrouter.PendingRetry": map[string]any{"n": p.N, "delay_ms": p.DelayMs, "not_before": p.NotBefore, "due_at": p.DueAt}}
	}
	if e := s.LastEvent; e != nil {
		m["last_event"] = map[string]any{avro.TaskEvent: taskEventNative(e)}
	}
	if in := s.LastInput; in != nil {
		m["last_input"] = map[string]any{"faultrouter.StateInput": map[string]any{
			"topic": in.Topic, "partition": in.Partition, "offset": in.Offset, "timestamp": in.Timestamp.Millis()}}
	}
	return encode(dst, c.state, m)
}
