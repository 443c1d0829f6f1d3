package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/emit"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// An input whose routed records cannot be written for a deterministic
// reason would fail its batch's transaction every time it is polled, and so
// stop its partition. Such an input goes to the dead-letter topic instead,
// as a bounded copy with a header that says why, gets its audit record, and
// the batch commits:
//
//   - before producing, when the records routed from it could be larger than
//     a topic they go to takes (limits.go): the input's size plus the largest
//     decision (emit.DecisionSlack) is over the smallest limit of the routed
//     topics; a poison input whose dead-letter copy (original bytes plus
//     error headers) does not fit is copied cut to maxRawCopyBytes;
//   - after producing, when the broker refuses a record routed from it with
//     an error that will not change on a retry (too large, invalid for the
//     topic): the transaction is aborted, the input is remembered, and when
//     the batch is polled again it is dead-lettered.
//
// Any other produce error aborts the transaction too, and the batch is
// polled again after a backoff (100 ms doubling to 5 s), so a broker in
// trouble sees no hot loop; the consumer lag gauge keeps counting the
// batch's records until it commits.

// Error kinds (faultrouter.error.kind) of input whose records cannot be
// written; the stage is codec.StageWrite.
const (
	kindTooLarge        = "too_large"
	kindInvalidForTopic = "invalid_for_topic"
)

const (
	// maxRawCopyBytes is how much of the original bytes a dead-letter copy
	// keeps when the whole input does not fit the dead-letter topic.
	maxRawCopyBytes = 64 << 10
)

// inputAt names an input record.
type inputAt struct {
	topic     string
	partition int32
	offset    int64
}

func at(rec *kgo.Record) inputAt { return inputAt{rec.Topic, rec.Partition, rec.Offset} }

// refusals are the inputs whose routed records cannot be written, one part
// of the data path (why and how: unwritable.go). It owns the inputs the broker
// refused for a deterministic reason, remembered until they are polled again
// and dead-lettered (remember, checkWritable, committed), and the backoff
// after a failed produce (pause). It asks which partitions this instance
// owns of an assignment. Used by the run loop's goroutine; checkWritable
// also by the decoding goroutines of a batch, which only read it.
type refusals struct {
	topics  Topics
	log     *slog.Logger
	owner   assignment
	byInput map[inputAt]refused
	backoff time.Duration
}

func newRefusals(topics Topics, log *slog.Logger, owner assignment) refusals {
	return refusals{topics: topics, log: log, owner: owner, byInput: map[inputAt]refused{}}
}

// refused is what the broker said about a record routed from an input.
type refused struct {
	kind string
	err  error
}

// deterministicKind returns the error kind of a produce error that will
// happen again for the same record, and false for any other error.
func deterministicKind(err error) (string, bool) {
	switch {
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return kindTooLarge, true
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.InvalidTopicException):
		return kindInvalidForTopic, true
	}
	return "", false
}

// checkWritable marks a task input whose routed records could not fit their
// topics, or that the broker refused before, as unwritable: it is then
// routed as poison at stage write (routeUnwritable). lim are the topics'
// record size limits.
func (u *refusals) checkWritable(in *input, lim *limits) {
	if in.kind != inputTask {
		return
	}
	if f, ok := u.byInput[at(in.rec)]; ok {
		in.kind, in.errKind, in.unwritable = inputPoison, f.kind, true
		in.err = fmt.Errorf("the broker refused a record routed from this event: %w", f.err)
		return
	}
	size := recordSize(in.rec) + emit.DecisionSlack
	t := u.topics
	for _, topic := range []string{t.Audit, t.Retry, t.Review, t.DeadLetter} {
		if limit := lim.of(topic); size > limit {
			in.kind, in.errKind, in.unwritable = inputPoison, kindTooLarge, true
			in.err = fmt.Errorf("its routed records could be %d bytes (the input's %d plus up to %d of decision), over %s's limit of %d bytes (max.message.bytes)",
				size, recordSize(in.rec), emit.DecisionSlack, topic, limit)
			return
		}
	}
}

// routeUnwritable queues the dead-letter and audit records of an input
// whose records cannot be written: a RoutedRecord with a bounded copy of
// its event (faultrouter.event.truncated names what was cut), error headers
// at stage write, and an audit record with the same copy. The task's state
// is not touched: the event was not routed.
func (r *Router) routeUnwritable(in *input, b *batch, now time.Time) {
	ev, cut := task.BoundedCopy(&in.event)
	in.decision = event.Decision{
		Class: event.ClassInvalidInput, Route: event.RouteDeadLetter, Rule: policy.OutputRule(in.errKind),
		Reason: fmt.Sprintf("event %s cannot be routed: %v; dead-lettered with a bounded copy of the event, the original is at %s/%d@%d",
			ev.EventID, in.err, in.rec.Topic, in.rec.Partition, in.rec.Offset),
		DecidedAt: event.At(now),
	}
	src := event.Source{Topic: in.rec.Topic, Partition: in.rec.Partition, Offset: in.rec.Offset, Timestamp: event.At(in.rec.Timestamp)}
	dl := r.out.Routed(&b.mem, r.cfg.Topics.DeadLetter, ev, nil, in.decision, src, in.rec.Headers)
	e := codec.ErrorInfo{Topic: in.rec.Topic, Partition: in.rec.Partition, Offset: in.rec.Offset, Timestamp: in.rec.Timestamp,
		Stage: codec.StageWrite, Class: string(in.decision.Class), Kind: in.errKind, Message: in.decision.Reason}
	dl.Headers = e.AppendHeaders(dl.Headers)
	audit := r.out.Routed(&b.mem, r.cfg.Topics.Audit, ev, nil, in.decision, src, in.rec.Headers)
	if len(cut) > 0 {
		c := codec.EventCopy{Truncated: cut, Topic: src.Topic, Partition: src.Partition, Offset: src.Offset}
		dl.Headers, audit.Headers = c.AppendHeaders(dl.Headers), c.AppendHeaders(audit.Headers)
	}
	in.event = *ev // what the logs and metrics see
	b.out = append(b.out, dl, audit)
}

// cutRaw bounds a raw dead-letter copy that does not fit the dead-letter
// topic: the value keeps its first maxRawCopyBytes, the input's own headers
// are dropped, and faultrouter.error.truncated says how long the original
// value was (the original stays on the input topic at
// faultrouter.error.topic/partition/offset).
func cutRaw(dl *kgo.Record) {
	n := len(dl.Value)
	dl.Value = dl.Value[:min(n, maxRawCopyBytes)]
	var hs []kgo.RecordHeader
	for _, h := range dl.Headers {
		if strings.HasPrefix(h.Key, codec.ErrorHeaderPrefix) {
			hs = append(hs, h)
		}
	}
	dl.Headers = append(hs, kgo.RecordHeader{Key: codec.HeaderErrorTruncated, Value: strconv.AppendInt(nil, int64(n), 10)})
}

// remember notes the inputs whose routed records the broker refused
// for a deterministic reason, so that the next poll of the batch
// dead-letters them. The broker refuses a whole partition batch, so only one
// record of each refused partition is blamed: the largest (too large) or the
// first (invalid); the others are produced again with the batch, and if the
// batch is refused again the next one is blamed. It reports whether any
// input was blamed.
func (u *refusals) remember(failed map[*kgo.Record]error, origin map[*kgo.Record]*kgo.Record) bool {
	type tp struct {
		topic     string
		partition int32
	}
	blame := map[tp]*kgo.Record{}
	for rec, err := range failed {
		kind, ok := deterministicKind(err)
		if !ok || origin[rec] == nil {
			continue
		}
		k := tp{rec.Topic, rec.Partition}
		cur := blame[k]
		switch {
		case cur == nil:
			blame[k] = rec
		case kind == kindTooLarge && recordSize(rec) > recordSize(cur):
			blame[k] = rec
		case kind != kindTooLarge && rec.Offset < cur.Offset:
			blame[k] = rec
		}
	}
	// an input polled again by this instance is forgotten when its batch
	// commits; one of a partition that has moved away never is: let those
	// go, so that the map holds only inputs of partitions owned now
	owned := u.owner.ownedSet()
	maps.DeleteFunc(u.byInput, func(k inputAt, _ refused) bool { return !owned[k.partition] })
	for _, rec := range blame {
		in, err := origin[rec], failed[rec]
		kind, _ := deterministicKind(err)
		u.byInput[at(in)] = refused{kind: kind, err: err}
		u.log.Warn("the broker refused a record routed from an input; it is dead-lettered when the batch is polled again",
			"task_id", string(in.Key), "topic", in.Topic, "partition", in.Partition, "offset", in.Offset, "to", rec.Topic, "bytes", recordSize(rec), "err", err)
	}
	return len(blame) > 0
}

// pause waits the abort backoff (100 ms doubling to 5 s) before the batch is
// polled again.
func (u *refusals) pause(ctx context.Context) {
	u.backoff = min(max(2*u.backoff, 100*time.Millisecond), 5*time.Second)
	select {
	case <-ctx.Done():
	case <-time.After(u.backoff):
	}
}

// committed forgets the inputs of a committed batch, and the backoff.
func (u *refusals) committed(b *batch) {
	u.backoff = 0
	for i := range b.inputs {
		delete(u.byInput, at(b.inputs[i].rec))
	}
}
