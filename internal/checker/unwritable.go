package checker

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Unwritable inputs. A task event whose routed records could be larger than
// a topic the router writes takes (its key, value and headers plus the
// largest decision a routed record carries, decisionSlack, over the smallest
// max.message.bytes of those topics, Options.MaxOutputBytes, less a record's
// overhead in a batch) cannot be routed: the router dead-letters it instead,
// as a RoutedRecord with a bounded copy of the event and error headers at
// stage write (kind too_large), audits it as INVALID_INPUT (rule
// output.too_large), leaves its task's state as it was, and routes the
// partition on. The model expects exactly that: one dead-letter record
// whose faultrouter.error.* headers name the input, its audit record, and
// no retry, review or alert (those checks find any); the inputs after it
// on its partition have their audit records (audit.missing finds a stall).

const (
	// decisionSlack bounds what a routed record holds beyond its input's
	// key, value and headers (docs/data-path.md, Unwritable input).
	decisionSlack = 48 << 10
	// recordOverhead is what a record costs in a batch beyond its key,
	// value and headers, as the router counts it.
	recordOverhead = 512
	// ruleTooLarge is the rule of an input dead-lettered because its
	// routed records would be too large.
	ruleTooLarge = "output." + kindTooLarge
	kindTooLarge = "too_large"
)

// recordSize is a record's key, value and headers size.
func recordSize(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 2
	}
	return n
}

// unwritable reports whether a task event's routed records could be over
// the smallest limit of the topics the router writes.
func (c *checker) unwritable(rec *kgo.Record) bool {
	return c.o.MaxOutputBytes > 0 && recordSize(rec)+decisionSlack > c.o.MaxOutputBytes-recordOverhead
}

// unwritableDecision is the decision of an unwritable input.
func unwritableDecision(in *input) event.Decision {
	return event.Decision{Class: event.ClassInvalidInput, Route: event.RouteDeadLetter, Rule: ruleTooLarge,
		Reason: fmt.Sprintf("%d bytes", recordSize(in.rec))}
}

// checkUnwritableCopy checks the dead-letter record of an unwritable input:
// the audited decision, the event's copy, and the error headers naming the
// input at stage write.
func (c *checker) checkUnwritableCopy(in *input, rec *kgo.Record, got *routed, ei codec.ErrorInfo) {
	switch {
	case got == nil:
		c.violate("deadletter.unwritable", in.task, "deadletter %d@%d for unwritable input %s is a raw copy, want a RoutedRecord with the event's bounded copy",
			rec.Partition, rec.Offset, in.key)
	case got.r.Decision.Class != event.ClassInvalidInput || got.r.Decision.Route != event.RouteDeadLetter || got.r.Decision.Rule != ruleTooLarge:
		c.violate("deadletter.unwritable", in.task, "deadletter %d@%d for unwritable input %s: %s/%s rule %s, want %s/%s rule %s",
			rec.Partition, rec.Offset, in.key, got.r.Decision.Class, got.r.Decision.Route, got.r.Decision.Rule, event.ClassInvalidInput, event.RouteDeadLetter, ruleTooLarge)
	case got.r.Event == nil || got.r.Event.EventID != in.event.EventID:
		c.violate("deadletter.unwritable", in.task, "deadletter %d@%d for unwritable input %s does not carry event %s", rec.Partition, rec.Offset, in.key, in.event.EventID)
	case ei.Stage != codec.StageWrite || ei.Kind != kindTooLarge || ei.Class != string(event.ClassInvalidInput) ||
		(inputKey{ei.Topic, ei.Partition, ei.Offset}) != in.key || ei.Message == "":
		c.violate("deadletter.unwritable", in.task, "deadletter %d@%d for unwritable input %s: error headers stage %q kind %q class %q input %s/%d@%d, want stage %q kind %q class %s input %s and a message",
			rec.Partition, rec.Offset, in.key, ei.Stage, ei.Kind, ei.Class, ei.Topic, ei.Partition, ei.Offset, codec.StageWrite, kindTooLarge, event.ClassInvalidInput, in.key)
	}
}
