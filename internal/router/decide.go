package router

// decide.go is the decide step of the data path: each input decided by the
// policy (pkg/policy) on its task's evolving state, in input order, and the
// records its route queues (route, emit: built by package emit); and the
// due retries published (publishDue). The breakers hold what they must (package hold).

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/internal/router/emit"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// observe hands a decided input to the breakers (package hold): a task
// event's outcome, or a reviewer's decision of its hallucination item.
func (r *Router) observe(in *input, b *batch, now time.Time) {
	switch in.Kind {
	case decode.Task:
		r.brk.Observe(&in.Event, &in.decision, in.state, b, now)
	case decode.Review:
		r.brk.Reviewed(&in.Review, &in.decision, in.state, b, now)
	}
}

// route decides one input record and queues its output records.
func (r *Router) route(in *input, b *batch, now time.Time) {
	switch in.Kind {
	case decode.Poison:
		if in.Unwritable {
			r.routeUnwritable(in, b, now) // records the broker would refuse (package refuse)
			return
		}
		in.decision = policy.Poison(in.ErrKind, in.Err, now)
		dl := r.deadLetterRaw(in, now)
		if !r.limits.Fits(dl) {
			emit.CutRaw(dl) // the original bytes and error headers do not fit
		}
		b.out = append(b.out, dl)
		b.out = append(b.out, r.audit(b, in, nil))
		return
	case decode.Command:
		in.decision = r.brk.Command(&in.Command, b, now) // package hold
		b.out = append(b.out, r.audit(b, in, nil))
		return
	case decode.Forward:
		d, fwd := r.fwd.Forward(in.Rec, in.TaskID(), in.Home, now) // package forward: its copy on its home partition
		in.decision = d
		b.out = append(b.out, fwd)
		var ev *event.TaskEvent
		if in.Fwd == decode.Task {
			ev, in.repeat = &in.Event, policy.RepeatForwarded // its copy is the attempt
		}
		b.out = append(b.out, r.audit(b, in, ev))
		return
	case decode.Review:
		st := b.state(in.Review.TaskID, in.Rec.Partition)
		in.state = st
		pending := st.Pending
		in.decision = r.cfg.Policy.DecideReview(&in.Review, st, now)
		if st.Pending != pending && pending != nil {
			r.brk.Forget(st.TaskID) // package hold: its held retry, if any, is replaced
		}
		r.trackReview(st, &in.decision, now)
		b.touch(st.TaskID, in.Rec.Partition)
		n := len(b.out)
		r.emit(in, st.LastEvent, st, b, now)
		for _, rec := range b.out[n:] {
			rec.Headers = emit.CopyHeaders(st, rec.Headers)
		}
		return
	}
	ev := &in.Event
	st := b.state(ev.TaskID, in.Rec.Partition)
	in.state = st
	hdr := codec.ParseHeaders(in.Rec.Headers)
	wasTerminal, isNew, last := st.Terminal, st.TaskID == "", st.LastEvent
	standing := r.cfg.Policy.StandingOf(st)
	// dedup, re-drive, policy (redrive.go)
	pending := st.Pending
	in.decision = r.cfg.Policy.DecideEvent(ev, st, hdr.Redrive, now)
	if st.Pending != pending && pending != nil {
		r.brk.Forget(ev.TaskID) // package hold: its held retry, if any, is replaced
	}
	if in.decision.Route != event.RouteDrop { // the ledger's view of it (pkg/policy/prevented.go)
		in.repeat = r.cfg.Policy.RepeatOf(ev, hdr.Redrive != nil, !isNew, in.Rec.Timestamp)
		in.prevented = r.cfg.Policy.Claim(standing, r.cfg.Policy.StandingOf(st), &in.decision)
	}
	if st.LastEvent != last { // the state keeps a bounded copy of this event
		st.LastInput = &event.Source{Topic: in.Rec.Topic, Partition: in.Rec.Partition, Offset: in.Rec.Offset, Timestamp: event.At(in.Rec.Timestamp)}
		if len(st.LastEventTruncated) == 0 { // a whole copy: its changelog record copies the input's body
			b.lastBody[st.LastEvent] = in.Value
		}
	}
	if in.decision.Route != event.RouteDrop {
		in.started, in.finished = isNew, st.Terminal && !wasTerminal
		if isNew || st.FirstEventAt == 0 {
			st.FirstEventAt = ev.OccurredAt.Millis()
		}
		if in.finished {
			in.taskMs = ev.OccurredAt.Millis() - st.FirstEventAt
		}
		st.SetTraceparent(hdr.Traceparent)
		r.trackReview(st, &in.decision, now)
	}
	b.touch(ev.TaskID, in.Rec.Partition)
	r.emit(in, ev, st, b, now)
}

// emit queues the audit record of in and the record of its route.
func (r *Router) emit(in *input, ev *event.TaskEvent, st *task.State, b *batch, now time.Time) {
	d := &in.decision
	switch d.Route {
	case event.RouteRetry:
		switch {
		case st.Pending == nil:
		case st.Pending.NotBefore > now.UnixMilli():
			// package hold: held now if its breakers will refuse it when due
			in.heldDue = 0
			if r.brk.HoldAhead(ev, st, in.Rec.Partition, now) {
				in.heldDue = st.Pending.Due()
			}
		case !r.brk.HoldRetry(ev, st, in.Rec.Partition, b, now):
			b.out = appendRetry(b.out, r.routed(b, r.cfg.Topics.Retry, in, ev, *d))
			st.Pending = nil
		}
	case event.RouteReview, event.RouteQuarantine:
		b.out = append(b.out, r.routed(b, r.cfg.Topics.Review, in, ev, *d))
	case event.RouteDeadLetter:
		b.out = append(b.out, r.routed(b, r.cfg.Topics.DeadLetter, in, ev, *d))
	case event.RouteComplete, event.RouteDrop:
	}
	b.out = append(b.out, r.audit(b, in, ev))
}

// publishDue publishes the pending retries that are due, of the tasks the
// batch touched: by its input or by the sweep of the due index.
func (r *Router) publishDue(b *batch, now time.Time) error {
	// tasks of this batch and of the due index alike
	for _, t := range b.touched {
		id, p := t.id, t.part
		st := b.states[id]
		d, due := policy.RetryDue(st, now)
		if !due {
			continue
		}
		topic := r.cfg.Topics.Retry
		if r.brk.HoldRetry(st.LastEvent, st, p, b, now) { // package hold: stays pending while a breaker is open
			if d, due = r.brk.GiveUp(st, now); !due { // unless its task's lifetime has ended
				continue
			}
			topic = r.cfg.Topics.DeadLetter
		}
		var hdr []kgo.RecordHeader
		if st.Traceparent != "" {
			hdr = []kgo.RecordHeader{{Key: codec.HeaderTraceparent, Value: []byte(st.Traceparent)}}
		}
		var src event.Source
		if st.LastInput != nil {
			src = *st.LastInput
		}
		rec := r.out.Routed(&b.mem, topic, st.LastEvent, nil, d, src, hdr)
		rec.Headers = emit.CopyHeaders(st, rec.Headers)
		st.Pending = nil
		if d.Route == event.RouteDeadLetter {
			b.out = append(b.out, rec)
			r.log.Warn("retry held behind breakers past its task's lifetime; dead-lettered, never published", "task_id", id,
				"topic", topic, "partition", p, "retry", d.Retry.N, "reason", d.Reason)
			continue
		}
		b.out = appendRetry(b.out, rec)
		r.log.Info("retry due; publishing in this batch's transaction", "task_id", id, "topic", topic, "partition", p, "retry", d.Retry.N)
	}
	return nil
}

// deadLetterRaw is the dead-letter record of a poison input: the original
// key, value and headers, plus the error headers (stage decode or validate).
func (r *Router) deadLetterRaw(in *input, now time.Time) *kgo.Record {
	stage := codec.StageDecode
	switch in.ErrKind {
	case decode.KindOversize, decode.KindEmptyKey, decode.KindKeyMismatch, codec.Kind(codec.ErrInvalidRecord):
		stage = codec.StageValidate
	}
	return emit.DeadLetterRaw(r.cfg.Topics.DeadLetter, in.Rec, stage, in.ErrKind, in.Err, now)
}

// audit is the audit record of an input: its event (nil for poison), the
// decision, and its topic-partition-offset. The audit record of a decision
// that stopped a task carries the cost it prevented (ledger.go).
func (r *Router) audit(b *batch, in *input, ev *event.TaskEvent) *kgo.Record {
	d := in.decision
	if in.Kind == decode.Task && ev != nil {
		d.Prevented = in.prevented
	}
	rec := r.routed(b, r.cfg.Topics.Audit, in, ev, d)
	if in.repeat != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: codec.HeaderRepeat, Value: []byte(in.repeat)})
	}
	return rec
}

// routed is the record of in's decision d on topic (package emit), with
// the error headers of a dead letter.
func (r *Router) routed(b *batch, topic string, in *input, ev *event.TaskEvent, d event.Decision) *kgo.Record {
	src := event.Source{Topic: in.Rec.Topic, Partition: in.Rec.Partition, Offset: in.Rec.Offset, Timestamp: event.At(in.Rec.Timestamp)}
	var raw []byte // the bytes ev was decoded from: its body is copied, not encoded again
	if ev == &in.Event {
		raw = in.Value
	}
	rec := r.out.Routed(&b.mem, topic, ev, raw, d, src, in.Rec.Headers)
	if ev == nil {
		rec.Key = in.Rec.Key
	}
	if topic == r.cfg.Topics.DeadLetter {
		e := codec.ErrorInfo{Stage: codec.StageRoute, Class: string(d.Class), Kind: d.Rule, Message: d.Reason}
		rec.Headers = e.AppendHeaders(rec.Headers)
	}
	return rec
}

// routeUnwritable queues the dead-letter and audit records of an input
// whose records cannot be written: a RoutedRecord with a bounded copy of
// its event (faultrouter.event.truncated names what was cut), error headers
// at stage write, and an audit record with the same copy. The task's state
// is not touched: the event was not routed.
func (r *Router) routeUnwritable(in *input, b *batch, now time.Time) {
	ev, cut := task.BoundedCopy(&in.Event)
	in.decision = event.Decision{
		Class: event.ClassInvalidInput, Route: event.RouteDeadLetter, Rule: policy.OutputRule(in.ErrKind),
		Reason: fmt.Sprintf("event %s cannot be routed: %v; dead-lettered with a bounded copy of the event, the original is at %s/%d@%d",
			ev.EventID, in.Err, in.Rec.Topic, in.Rec.Partition, in.Rec.Offset),
		DecidedAt: event.At(now),
	}
	src := event.Source{Topic: in.Rec.Topic, Partition: in.Rec.Partition, Offset: in.Rec.Offset, Timestamp: event.At(in.Rec.Timestamp)}
	dl := r.out.Routed(&b.mem, r.cfg.Topics.DeadLetter, ev, nil, in.decision, src, in.Rec.Headers)
	e := codec.ErrorInfo{Topic: in.Rec.Topic, Partition: in.Rec.Partition, Offset: in.Rec.Offset, Timestamp: in.Rec.Timestamp,
		Stage: codec.StageWrite, Class: string(in.decision.Class), Kind: in.ErrKind, Message: in.decision.Reason}
	dl.Headers = e.AppendHeaders(dl.Headers)
	audit := r.out.Routed(&b.mem, r.cfg.Topics.Audit, ev, nil, in.decision, src, in.Rec.Headers)
	if len(cut) > 0 {
		c := codec.EventCopy{Truncated: cut, Topic: src.Topic, Partition: src.Partition, Offset: src.Offset}
		dl.Headers, audit.Headers = c.AppendHeaders(dl.Headers), c.AppendHeaders(audit.Headers)
	}
	in.Event = *ev // what the logs and metrics see
	b.out = append(b.out, dl, audit)
}
