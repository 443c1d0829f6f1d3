package codec

import (
	"fmt"
	"unsafe"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// EncodeTaskEvent validates e and appends its single-object encoding to dst.
func (c *Codec) EncodeTaskEvent(dst []byte, e *event.TaskEvent) ([]byte, error) {
	if err := e.Validate(); err != nil {
		return dst, fmt.Errorf("%w: task %s: %w", ErrInvalidRecord, e.TaskID, err)
	}
	if c.event != nil && c.wire != nil && c.taskEvent == c.wire.event {
		n := len(dst)
		out, err := c.event.encode(header(dst, c.taskEvent), e)
		if err != nil {
			return dst[:n], err
		}
		return out, nil
	}
	n := teNatives.Get().(*teNative)
	defer n.release()
	return encode(dst, c.taskEvent, n.fill(e))
}

// DecodeTaskEvent decodes and validates a TaskEvent. When the record decodes
// but is invalid (ErrInvalidRecord), the decoded event is returned with the
// error, so that the caller can log its task_id.
func (c *Codec) DecodeTaskEvent(b []byte) (event.TaskEvent, error) {
	b, err := c.singleObject(b)
	if err != nil {
		return event.TaskEvent{}, err
	}
	var e event.TaskEvent
	if ok, err := c.decodeTaskEventWire(b, &e, false); ok {
		return e, err
	}
	return c.decodeTaskEventGoavro(b)
}

// DecodeTaskEventInto is DecodeTaskEvent into *e, which it overwrites, for
// the router's hot path: the event is decoded in place, and its strings share
// one copy of b's body instead of one allocation each. A string kept beyond
// the event keeps that copy alive (at most b's size): clone what outlives it.
func (c *Codec) DecodeTaskEventInto(b []byte, e *event.TaskEvent) error {
	b, err := c.singleObject(b)
	if err != nil {
		return err
	}
	if ok, err := c.decodeTaskEventWire(b, e, true); ok {
		return err
	}
	*e, err = c.decodeTaskEventGoavro(b)
	return err
}

// decodeTaskEventGoavro decodes b with goavro only: the schema authority,
// for the schema versions the wire reader does not read, and what the wire
// reader is compared with.
func (c *Codec) decodeTaskEventGoavro(b []byte) (event.TaskEvent, error) {
	m, _, err := c.decodeAs(b, avro.TaskEvent)
	if err != nil {
		return event.TaskEvent{}, err
	}
	d := nat{v: c.view}
	e := c.taskEventFrom(&d, m)
	if d.err != nil {
		return event.TaskEvent{}, d.err
	}
	return e, checkTaskEvent(&e)
}

// decodeTaskEventWire decodes a TaskEvent of the current schema into *e with
// event_wire.go's reader. ok is false when it does not apply (another writer
// schema) or the body does not read, so that goavro decodes it and reports
// the error; *e is then undefined. With shared, the strings of *e are views
// of one copy of the body.
func (c *Codec) decodeTaskEventWire(b []byte, e *event.TaskEvent, shared bool) (ok bool, err error) {
	if c.event == nil || c.wire == nil {
		return false, nil
	}
	if w, err := c.writerOf(b); err != nil || w != c.wire.event {
		return false, nil
	}
	*e = event.TaskEvent{}
	r := rd{b: b[headerLen:]}
	if shared && len(r.b) > 0 {
		body := string(r.b) // immutable: nothing writes through the views
		r.b, r.view = unsafe.Slice(unsafe.StringData(body), len(body)), true
	}
	d := nat{v: c.view}
	c.event.decode(&r, &d, e)
	if r.err != nil || len(r.b) != 0 {
		return false, nil
	}
	if d.err != nil {
		*e = event.TaskEvent{}
		return true, d.err
	}
	for _, drop := range c.view.dropTaskEvent {
		drop(e)
	}
	return true, checkTaskEvent(e)
}

// checkTaskEvent is the contract of a decoded TaskEvent.
func checkTaskEvent(e *event.TaskEvent) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: task %q: %w", ErrInvalidRecord, e.TaskID, err)
	}
	if err := finite("usage.cost_usd", e.Usage.CostUSD); err != nil {
		return err
	}
	if e.Output != nil && e.Output.Confidence != nil {
		return finite("output.confidence", *e.Output.Confidence)
	}
	return nil
}

func optString(s string) any {
	if s == "" {
		return nil
	}
	return map[string]any{"string": s}
}

// taskEventNative returns the native form of e in fresh maps, for callers
// that keep it beyond one encode.
func taskEventNative(e *event.TaskEvent) map[string]any { return newTENative().fill(e) }

func (c *Codec) taskEventFrom(d *nat, m map[string]any) event.TaskEvent {
	e := event.TaskEvent{
		EventID:        d.str(m, "event_id"),
		TaskID:         d.str(m, "task_id"),
		Attempt:        d.i32(m, "attempt"),
		OccurredAt:     d.ts(m, "occurred_at"),
		Source:         d.str(m, "source"),
		Action:         d.str(m, "action"),
		Provider:       d.optStr(m, "provider"),
		Model:          d.optStr(m, "model"),
		PromptTemplate: d.optStr(m, "prompt_template"),
		Stage:          event.Stage(d.enum("stage", "faultrouter.Stage", d.union(m, "stage"))),
		Status:         event.Status(d.enum("status", "faultrouter.Status", m["status"])),
		SLAMs:          d.optI64(m, "sla_ms"),
	}
	if x := d.optRecord(m, "error"); x != nil {
		e.Error = &event.Error{
			Type:         d.optStr(x, "type"),
			HTTPStatus:   d.optI32(x, "http_status"),
			Code:         d.optStr(x, "code"),
			Message:      d.optStr(x, "message"),
			RetryAfterMs: d.optI64(x, "retry_after_ms"),
		}
	}
	if o := d.optRecord(m, "output"); o != nil {
		e.Output = &event.Output{
			Text:        d.optStr(o, "text"),
			SchemaValid: d.optBool(o, "schema_valid"),
			Confidence:  d.optF64(o, "confidence"),
		}
		switch flags := o["flags"].(type) {
		case []any:
			if len(flags) > 0 {
				e.Output.Flags = make([]string, len(flags))
				for i, f := range flags {
					e.Output.Flags[i] = d.asStr("output.flags", f)
				}
			}
		case nil:
		default:
			d.fail("output.flags", flags)
		}
	}
	if u := d.record(m, "usage"); u != nil {
		e.Usage = event.Usage{CostUSD: d.f64(u, "cost_usd"), Tokens: d.i64(u, "tokens"), ElapsedMs: d.i64(u, "elapsed_ms")}
	}
	if op := d.optRecord(m, "operation"); op != nil {
		e.Operation = &event.Operation{
			OpID:         d.str(op, "op_id"),
			Kind:         event.OpKind(d.enum("operation.kind", "faultrouter.OpKind", op["kind"])),
			ParamsSHA256: d.optStr(op, "params_sha256"),
			State:        event.OpState(d.enum("operation.state", "faultrouter.OpState", op["state"])),
		}
	}
	if r := d.optRecord(m, "input_ref"); r != nil {
		e.InputRef = &event.InputRef{URI: d.str(r, "uri"), SHA256: d.optStr(r, "sha256")}
		if n := d.optI64(r, "size_bytes"); n != nil {
			e.InputRef.SizeBytes = *n
		}
	}
	switch attrs := m["attributes"].(type) {
	case map[string]any:
		if len(attrs) > 0 {
			e.Attributes = make(map[string]string, len(attrs))
			for k, v := range attrs {
				e.Attributes[k] = d.asStr("attributes", v)
			}
		}
	case nil:
	default:
		d.fail("attributes", attrs)
	}
	for _, drop := range c.view.dropTaskEvent {
		drop(&e)
	}
	return e
}

// taskEventFields maps every TaskEvent field path of the Go type to the code
// that clears it, for readers whose schema version lacks the field.
var taskEventFields = []struct {
	path string
	drop func(*event.TaskEvent)
}{
	{"event_id", func(e *event.TaskEvent) { e.EventID = "" }},
	{"task_id", func(e *event.TaskEvent) { e.TaskID = "" }},
	{"attempt", func(e *event.TaskEvent) { e.Attempt = 0 }},
	{"occurred_at", func(e *event.TaskEvent) { e.OccurredAt = event.Timestamp{} }},
	{"source", func(e *event.TaskEvent) { e.Source = "" }},
	{"action", func(e *event.TaskEvent) { e.Action = "" }},
	{"provider", func(e *event.TaskEvent) { e.Provider = "" }},
	{"model", func(e *event.TaskEvent) { e.Model = "" }},
	{"prompt_template", func(e *event.TaskEvent) { e.PromptTemplate = "" }},
	{"stage", func(e *event.TaskEvent) { e.Stage = "" }},
	{"status", func(e *event.TaskEvent) { e.Status = "" }},
	{"error", func(e *event.TaskEvent) { e.Error = nil }},
	{"error.type", func(e *event.TaskEvent) { ifErr(e, func(x *event.Error) { x.Type = "" }) }},
	{"error.http_status", func(e *event.TaskEvent) { ifErr(e, func(x *event.Error) { x.HTTPStatus = 0 }) }},
	{"error.code", func(e *event.TaskEvent) { ifErr(e, func(x *event.Error) { x.Code = "" }) }},
	{"error.message", func(e *event.TaskEvent) { ifErr(e, func(x *event.Error) { x.Message = "" }) }},
	{"error.retry_after_ms", func(e *event.TaskEvent) { ifErr(e, func(x *event.Error) { x.RetryAfterMs = nil }) }},
	{"output", func(e *event.TaskEvent) { e.Output = nil }},
	{"output.text", func(e *event.TaskEvent) { ifOut(e, func(o *event.Output) { o.Text = "" }) }},
	{"output.schema_valid", func(e *event.TaskEvent) { ifOut(e, func(o *event.Output) { o.SchemaValid = nil }) }},
	{"output.confidence", func(e *event.TaskEvent) { ifOut(e, func(o *event.Output) { o.Confidence = nil }) }},
	{"output.flags", func(e *event.TaskEvent) { ifOut(e, func(o *event.Output) { o.Flags = nil }) }},
	{"usage", func(e *event.TaskEvent) { e.Usage = event.Usage{} }},
	{"usage.cost_usd", func(e *event.TaskEvent) { e.Usage.CostUSD = 0 }},
	{"usage.tokens", func(e *event.TaskEvent) { e.Usage.Tokens = 0 }},
	{"usage.elapsed_ms", func(e *event.TaskEvent) { e.Usage.ElapsedMs = 0 }},
	{"operation", func(e *event.TaskEvent) { e.Operation = nil }},
	{"operation.op_id", func(e *event.TaskEvent) { ifOp(e, func(o *event.Operation) { o.OpID = "" }) }},
	{"operation.kind", func(e *event.TaskEvent) { ifOp(e, func(o *event.Operation) { o.Kind = "" }) }},
	{"operation.params_sha256", func(e *event.TaskEvent) { ifOp(e, func(o *event.Operation) { o.ParamsSHA256 = "" }) }},
	{"operation.state", func(e *event.TaskEvent) { ifOp(e, func(o *event.Operation) { o.State = "" }) }},
	{"input_ref", func(e *event.TaskEvent) { e.InputRef = nil }},
	{"input_ref.uri", func(e *event.TaskEvent) { ifRef(e, func(r *event.InputRef) { r.URI = "" }) }},
	{"input_ref.sha256", func(e *event.TaskEvent) { ifRef(e, func(r *event.InputRef) { r.SHA256 = "" }) }},
	{"input_ref.size_bytes", func(e *event.TaskEvent) { ifRef(e, func(r *event.InputRef) { r.SizeBytes = 0 }) }},
	{"sla_ms", func(e *event.TaskEvent) { e.SLAMs = nil }},
	{"attributes", func(e *event.TaskEvent) { e.Attributes = nil }},
}

func ifErr(e *event.TaskEvent, f func(*event.Error)) {
	if e.Error != nil {
		f(e.Error)
	}
}

func ifOut(e *event.TaskEvent, f func(*event.Output)) {
	if e.Output != nil {
		f(e.Output)
	}
}

func ifOp(e *event.TaskEvent, f func(*event.Operation)) {
	if e.Operation != nil {
		f(e.Operation)
	}
}

func ifRef(e *event.TaskEvent, f func(*event.InputRef)) {
	if e.InputRef != nil {
		f(e.InputRef)
	}
}
