// Package refuse keeps the router from writing what the broker refuses.
//
// An input whose routed records cannot be written for a deterministic
// reason would fail its batch's transaction every time it is polled, and so
// stop its partition. Such an input goes to the dead-letter topic instead,
// as a bounded copy with a header that says why, gets its audit record, and
// the batch commits:
//
//   - before producing, when the records routed from it could be larger than
//     a topic they go to takes (Limits): the input's size plus the largest
//     decision (emit.DecisionSlack) is over the smallest limit of the routed
//     topics; a poison input whose dead-letter copy (original bytes plus
//     error headers) does not fit is copied cut (emit.CutRaw);
//   - after producing, when the broker refuses a record routed from it with
//     an error that will not change on a retry (too large, invalid for the
//     topic): the transaction is aborted, the input is remembered
//     (Refusals.Remember), and when the batch is polled again it is
//     dead-lettered (Refusals.Check).
//
// Any other produce error aborts the transaction too, and the batch is
// polled again after a backoff (Refusals.Pause: 100 ms doubling to 5 s), so
// a broker in trouble sees no hot loop; the consumer lag gauge keeps
// counting the batch's records until it commits.
package refuse

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/internal/router/emit"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Error kinds (faultrouter.error.kind) of input whose records cannot be
// written; the stage is codec.StageWrite.
const (
	KindTooLarge        = "too_large"
	KindInvalidForTopic = "invalid_for_topic"
)

// inputAt names an input record.
type inputAt struct {
	topic     string
	partition int32
	offset    int64
}

func at(rec *kgo.Record) inputAt { return inputAt{rec.Topic, rec.Partition, rec.Offset} }

// Refusals are the inputs whose routed records cannot be written: the
// inputs the broker refused for a deterministic reason, remembered until
// they are polled again and dead-lettered (Remember, Check, Committed), and
// the backoff after a failed produce (Pause). Used by the run loop's
// goroutine; Check also by the decoding goroutines of a batch, which only
// read it.
type Refusals struct {
	topics  topicspec.Topics
	log     *slog.Logger
	owned   func() map[int32]bool
	byInput map[inputAt]refused
	backoff time.Duration
}

// New returns the refusals of a router writing to topics; owned returns the
// ingress partitions the instance owns.
func New(topics topicspec.Topics, log *slog.Logger, owned func() map[int32]bool) *Refusals {
	return &Refusals{topics: topics, log: log, owned: owned, byInput: map[inputAt]refused{}}
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
		return KindTooLarge, true
	case errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.InvalidTopicException):
		return KindInvalidForTopic, true
	}
	return "", false
}

// Check marks a task input whose routed records could not fit their
// topics, or that the broker refused before, as unwritable: kind Poison
// with Unwritable set, which the router dead-letters at stage write. lim
// are the topics' record size limits.
func (u *Refusals) Check(in *decode.Input, lim *Limits) {
	if in.Kind != decode.Task {
		return
	}
	if f, ok := u.byInput[at(in.Rec)]; ok {
		in.Kind, in.ErrKind, in.Unwritable = decode.Poison, f.kind, true
		in.Err = fmt.Errorf("the broker refused a record routed from this event: %w", f.err)
		return
	}
	n := Size(in.Rec)
	size := n + emit.DecisionSlack
	t := u.topics
	for _, topic := range []string{t.Audit, t.Retry, t.Review, t.DeadLetter} {
		if limit := lim.Of(topic); size > limit {
			in.Kind, in.ErrKind, in.Unwritable = decode.Poison, KindTooLarge, true
			in.Err = fmt.Errorf("its routed records could be %d bytes (the input's %d plus up to %d of decision), over %s's limit of %d bytes (max.message.bytes)",
				size, n, emit.DecisionSlack, topic, limit)
			return
		}
	}
}

// Remember notes the inputs whose routed records the broker refused for a
// deterministic reason (failed: each refused record's error; origin: the
// input each record was routed from), so that the next poll of the batch
// dead-letters them. The broker refuses a whole partition batch, so only
// one record of each refused partition is blamed: the largest (too large)
// or the first (invalid); the others are produced again with the batch,
// and if the batch is refused again the next one is blamed. It reports
// whether any input was blamed.
func (u *Refusals) Remember(failed map[*kgo.Record]error, origin map[*kgo.Record]*kgo.Record) bool {
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
		case kind == KindTooLarge && Size(rec) > Size(cur):
			blame[k] = rec
		case kind != KindTooLarge && rec.Offset < cur.Offset:
			blame[k] = rec
		}
	}
	// an input polled again by this instance is forgotten when its batch
	// commits; one of a partition that has moved away never is: let those
	// go, so that the map holds only inputs of partitions owned now
	owned := u.owned()
	maps.DeleteFunc(u.byInput, func(k inputAt, _ refused) bool { return !owned[k.partition] })
	for _, rec := range blame {
		in, err := origin[rec], failed[rec]
		kind, _ := deterministicKind(err)
		u.byInput[at(in)] = refused{kind: kind, err: err}
		u.log.Warn("the broker refused a record routed from an input; it is dead-lettered when the batch is polled again",
			"task_id", string(in.Key), "topic", in.Topic, "partition", in.Partition, "offset", in.Offset, "to", rec.Topic, "bytes", Size(rec), "err", err)
	}
	return len(blame) > 0
}

// Pause waits the abort backoff (100 ms doubling to 5 s) before the batch is
// polled again.
func (u *Refusals) Pause(ctx context.Context) {
	u.backoff = min(max(2*u.backoff, 100*time.Millisecond), 5*time.Second)
	select {
	case <-ctx.Done():
	case <-time.After(u.backoff):
	}
}

// Committed forgets the inputs of a committed batch, recs, and the backoff.
func (u *Refusals) Committed(recs []*kgo.Record) {
	u.backoff = 0
	for _, rec := range recs {
		delete(u.byInput, at(rec))
	}
}
