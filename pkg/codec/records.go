package codec

import (
	"fmt"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// plainRoutedVersion is the RoutedRecord version written for a decision
// that no policy override made: version 3 only adds decision.override, so
// a policy without overrides writes records every version-2 reader reads.
const plainRoutedVersion = 2

// routedWriter is the schema r is written with, and its wire encoder.
func (c *Codec) routedWriter(r *event.Routed) (*writer, *routedWire) {
	if r.Decision.Override == "" && c.routedPlain != nil {
		return c.routedPlain, c.wirePlain
	}
	return c.routed, c.wire
}

// EncodeRouted appends the single-object encoding of r to dst: with
// RoutedRecord version 2 when r's decision names no override, the current
// version otherwise.
func (c *Codec) EncodeRouted(dst []byte, r *event.Routed) ([]byte, error) {
	return c.EncodeRoutedFrom(dst, r, nil)
}

// EncodeRoutedFrom is EncodeRouted for the routed record of an input: in is
// the single-object encoding r.Event was decoded from (nil when there is
// none). When in was written with the TaskEvent schema the RoutedRecord
// embeds, the event's body is copied from it rather than encoded again.
func (c *Codec) EncodeRoutedFrom(dst []byte, r *event.Routed, in []byte) ([]byte, error) {
	if _, wire := c.routedWriter(r); wire == nil {
		return c.encodeRoutedNative(dst, r)
	}
	return c.encodeRoutedWire(dst, r, in)
}

// encodeRoutedWire encodes r with routed_wire.go's encoder.
func (c *Codec) encodeRoutedWire(dst []byte, r *event.Routed, in []byte) ([]byte, error) {
	var body []byte
	if r.Event != nil {
		if w, err := c.writerOf(in); err == nil && w == c.wire.event { // wirePlain embeds the same
			body = in[headerLen:]
		} else if c.event != nil {
			if body, err = c.event.encode(nil, r.Event); err != nil {
				return dst, err
			}
		} else {
			n := teNatives.Get().(*teNative)
			body, err = c.wire.event.codec.BinaryFromNative(nil, n.fill(r.Event))
			n.release()
			if err != nil {
				return dst, fmt.Errorf("codec: encode %s: %w", avro.RoutedRecord, err)
			}
		}
	}
	w, wire := c.routedWriter(r)
	n := len(dst)
	out, err := wire.encode(header(dst, w), r, body)
	if err != nil {
		return dst[:n], err
	}
	return out, nil
}

// encodeRoutedNative encodes r with goavro.
func (c *Codec) encodeRoutedNative(dst []byte, r *event.Routed) ([]byte, error) {
	m := make(map[string]any, 3)
	m["event"] = nil
	if r.Event != nil {
		n := teNatives.Get().(*teNative)
		defer n.release()
		m["event"] = map[string]any{avro.TaskEvent: n.fill(r.Event)}
	}
	m["decision"] = decisionNative(&r.Decision)
	m["input"] = map[string]any{
		"topic": r.Input.Topic, "partition": r.Input.Partition, "offset": r.Input.Offset,
		"timestamp": r.Input.Timestamp.Millis(),
	}
	w, _ := c.routedWriter(r)
	if w != c.routed {
		delete(m["decision"].(map[string]any), "override")
	}
	return encode(dst, w, m)
}

// DecodeRouted decodes a RoutedRecord. Its event, when present, was
// validated on ingress and is not validated again; only its amounts and the
// decision's totals are checked to be finite numbers.
func (c *Codec) DecodeRouted(b []byte) (event.Routed, error) {
	b, err := c.singleObject(b)
	if err != nil {
		return event.Routed{}, err
	}
	m, _, err := c.decodeAs(b, avro.RoutedRecord)
	if err != nil {
		return event.Routed{}, err
	}
	d := nat{v: c.view}
	var r event.Routed
	if em := d.optRecord(m, "event"); em != nil {
		e := c.taskEventFrom(&d, em)
		r.Event = &e
	}
	if dm := d.record(m, "decision"); dm != nil {
		r.Decision = decisionFrom(&d, dm)
	}
	if in := d.record(m, "input"); in != nil {
		r.Input = event.Source{
			Topic: d.str(in, "topic"), Partition: d.i32(in, "partition"),
			Offset: d.i64(in, "offset"), Timestamp: d.ts(in, "timestamp"),
		}
	}
	if d.err != nil {
		return event.Routed{}, d.err
	}
	if err := finiteRouted(&r); err != nil {
		return event.Routed{}, err
	}
	return r, nil
}

func decisionNative(x *event.Decision) map[string]any {
	m := map[string]any{
		"class":  string(x.Class),
		"route":  string(x.Route),
		"rule":   x.Rule,
		"reason": x.Reason,
		"retry":  nil,
		"totals": map[string]any{
			"attempts": x.Totals.Attempts, "retries": x.Totals.Retries, "cost_usd": x.Totals.CostUSD,
			"tokens": x.Totals.Tokens, "elapsed_ms": x.Totals.ElapsedMs,
		},
		"review":          nil,
		"feedback":        optString(x.Feedback),
		"suggested_model": optString(x.SuggestedModel),
		"user_message":    optString(x.UserMessage),
		"decided_at":      x.DecidedAt.Millis(),
		"override":        optString(x.Override),
	}
	if p := x.Retry; p != nil {
		m["retry"] = map[string]any{"faultrouter.RetryPlan": map[string]any{
			"n": p.N, "delay_ms": p.DelayMs, "not_before": p.NotBefore.Millis(),
		}}
	}
	if rv := x.Review; rv != nil {
		m["review"] = map[string]any{"faultrouter.Review": map[string]any{
			"owner": rv.Owner, "sla_ms": rv.SLAMs, "priority": rv.Priority,
		}}
	}
	m["prevented"] = nil
	if p := x.Prevented; p != nil {
		m["prevented"] = map[string]any{"faultrouter.Prevented": map[string]any{
			"stop": p.Stop, "baseline_retries": p.BaselineRetries, "attempts": p.Attempts, "usd": p.USD,
		}}
	}
	return m
}

func decisionFrom(d *nat, m map[string]any) event.Decision {
	x := event.Decision{
		Class:          event.Class(d.enum("decision.class", "faultrouter.Class", m["class"])),
		Route:          event.Route(d.enum("decision.route", "faultrouter.Route", m["route"])),
		Rule:           d.str(m, "rule"),
		Reason:         d.str(m, "reason"),
		Feedback:       d.optStr(m, "feedback"),
		SuggestedModel: d.optStr(m, "suggested_model"),
		UserMessage:    d.optStr(m, "user_message"),
		DecidedAt:      d.ts(m, "decided_at"),
		Override:       d.optStr(m, "override"), // a writer before version 3 has none
	}
	if p := d.optRecord(m, "retry"); p != nil {
		x.Retry = &event.RetryPlan{N: d.i32(p, "n"), DelayMs: d.i64(p, "delay_ms"), NotBefore: d.ts(p, "not_before")}
	}
	if t := d.record(m, "totals"); t != nil {
		x.Totals = event.Totals{
			Attempts: d.i32(t, "attempts"), Retries: d.i32(t, "retries"), CostUSD: d.f64(t, "cost_usd"),
			Tokens: d.i64(t, "tokens"), ElapsedMs: d.i64(t, "elapsed_ms"),
		}
	}
	if rv := d.optRecord(m, "review"); rv != nil {
		x.Review = &event.Review{Owner: d.str(rv, "owner"), SLAMs: d.i64(rv, "sla_ms"), Priority: d.str(rv, "priority")}
	}
	if _, ok := m["prevented"]; ok { // a version 1 writer has no prevented
		if p := d.optRecord(m, "prevented"); p != nil {
			x.Prevented = &event.Prevented{Stop: d.str(p, "stop"), BaselineRetries: d.i32(p, "baseline_retries"),
				Attempts: d.i32(p, "attempts"), USD: d.f64(p, "usd")}
		}
	}
	return x
}

// EncodeBreakerEvent appends the single-object encoding of e to dst.
func (c *Codec) EncodeBreakerEvent(dst []byte, e *event.BreakerEvent) ([]byte, error) {
	var class any
	if e.Class != "" {
		class = map[string]any{"faultrouter.Class": string(e.Class)}
	}
	m := map[string]any{
		"scope": string(e.Scope), "key": e.Key, "kind": e.Kind,
		"from": optString(string(e.From)), "to": optString(string(e.To)),
		"reason": e.Reason, "class": class,
		"failures": e.Failures, "requests": e.Requests,
		"task_id": optString(e.TaskID), "instance": e.Instance, "at": e.At.Millis(),
	}
	return encode(dst, c.breaker, m)
}

// DecodeBreakerEvent decodes a BreakerEvent.
func (c *Codec) DecodeBreakerEvent(b []byte) (event.BreakerEvent, error) {
	b, err := c.singleObject(b)
	if err != nil {
		return event.BreakerEvent{}, err
	}
	m, _, err := c.decodeAs(b, avro.BreakerEvent)
	if err != nil {
		return event.BreakerEvent{}, err
	}
	d := nat{v: c.view}
	e := event.BreakerEvent{
		Scope: event.BreakerScope(d.str(m, "scope")), Key: d.str(m, "key"), Kind: d.str(m, "kind"),
		From: event.BreakerStateName(d.optStr(m, "from")), To: event.BreakerStateName(d.optStr(m, "to")), Reason: d.str(m, "reason"),
		Class:    event.Class(d.enum("class", "faultrouter.Class", d.union(m, "class"))),
		Failures: d.i32(m, "failures"), Requests: d.i32(m, "requests"),
		TaskID: d.optStr(m, "task_id"), Instance: d.str(m, "instance"), At: d.ts(m, "at"),
	}
	if d.err != nil {
		return event.BreakerEvent{}, d.err
	}
	return e, nil
}

// EncodeReviewDecision validates x and appends its single-object encoding to dst.
func (c *Codec) EncodeReviewDecision(dst []byte, x *event.ReviewDecision) ([]byte, error) {
	if err := x.Validate(); err != nil {
		return dst, fmt.Errorf("%w: task %s: %w", ErrInvalidRecord, x.TaskID, err)
	}
	m := map[string]any{
		"task_id": x.TaskID, "approve": x.Approve, "reason": x.Reason,
		"reviewer": optString(x.Reviewer), "at": x.At.Millis(),
	}
	return encode(dst, c.review, m)
}

// DecodeReviewDecision decodes and validates a ReviewDecision.
func (c *Codec) DecodeReviewDecision(b []byte) (event.ReviewDecision, error) {
	b, err := c.singleObject(b)
	if err != nil {
		return event.ReviewDecision{}, err
	}
	m, _, err := c.decodeAs(b, avro.ReviewDecision)
	if err != nil {
		return event.ReviewDecision{}, err
	}
	d := nat{v: c.view}
	x := event.ReviewDecision{
		TaskID: d.str(m, "task_id"), Approve: d.boolean(m, "approve"), Reason: d.str(m, "reason"),
		Reviewer: d.optStr(m, "reviewer"), At: d.ts(m, "at"),
	}
	if d.err != nil {
		return event.ReviewDecision{}, d.err
	}
	if err := x.Validate(); err != nil {
		return x, fmt.Errorf("%w: task %q: %w", ErrInvalidRecord, x.TaskID, err)
	}
	return x, nil
}

// finiteRouted rejects NaN and infinite amounts in a routed record.
func finiteRouted(r *event.Routed) error {
	if err := finite("decision.totals.cost_usd", r.Decision.Totals.CostUSD); err != nil {
		return err
	}
	if p := r.Decision.Prevented; p != nil {
		if err := finite("decision.prevented.usd", p.USD); err != nil {
			return err
		}
	}
	if e := r.Event; e != nil {
		if err := finite("usage.cost_usd", e.Usage.CostUSD); err != nil {
			return err
		}
		if e.Output != nil && e.Output.Confidence != nil {
			return finite("output.confidence", *e.Output.Confidence)
		}
	}
	return nil
}
