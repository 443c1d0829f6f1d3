// Package control writes an operator's instructions to Kafka: a reviewer's
// decision on the decisions topic, a breaker reset or latch on the breakers
// topic (audited from every partition of the decisions topic), and a re-drive of dead-letter or review records to
// ingress in one transaction. The CLI verbs (review decide, breaker reset,
// replay --redrive-to) and the operator console (internal/console) write through
// it; the router reads and audits what it writes.
package control

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Sentinel errors of the instructions.
var (
	// ErrMissing is returned for an instruction without a field it needs
	// (task, reason, key); the message names the field.
	ErrMissing = errors.New("control: missing field")
	// ErrNoTopic is returned when the decisions topic does not exist.
	ErrNoTopic = errors.New("control: topic not found; is the router's topic prefix right?")
)

// Decide writes review decisions to the decisions topic, keyed by task ID (so
// each lands on its task's partition), all or none acknowledged.
func Decide(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topic string, ds ...event.ReviewDecision) error {
	return DecideFramed(ctx, opts, c, topic, nil, ds...)
}

// DecideFramed is Decide with each encoded value passed through frame (nil:
// as encoded), e.g. a schema registry's Framer for the Confluent wire format.
func DecideFramed(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topic string, frame func(topic string, v []byte) []byte, ds ...event.ReviewDecision) error {
	recs := make([]*kgo.Record, 0, len(ds))
	for i := range ds {
		d := &ds[i]
		if d.At.IsZero() {
			d.At = event.At(time.Now())
		}
		if err := d.Validate(); err != nil {
			return fmt.Errorf("%w: task %q: %v", ErrMissing, d.TaskID, err)
		}
		v, err := c.EncodeReviewDecision(nil, d)
		if err != nil {
			return fmt.Errorf("control: task %s: %w", d.TaskID, err)
		}
		if frame != nil {
			v = frame(topic, v)
		}
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(d.TaskID), Value: v})
	}
	cl, err := kgo.NewClient(append(opts, kgo.RecordDeliveryTimeout(deliveryTimeout))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := partitions(ctx, cl, topic); err != nil {
		return fmt.Errorf("control: writing %d decision(s): %w", len(recs), err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("control: writing %d decision(s) to %s: %w", len(recs), topic, err)
	}
	return nil
}

// deliveryTimeout bounds a produce that cannot be delivered (franz-go's
// default retries forever).
const deliveryTimeout = 30 * time.Second

// partitions returns the partitions of topic. Listing them fails at once,
// naming the cause (failed authentication, an untrusted certificate, a
// missing topic), where a produce would retry until its delivery timeout.
func partitions(ctx context.Context, cl *kgo.Client, topic string) (map[int32]kadm.PartitionDetail, error) {
	topics, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		return nil, err
	}
	td, ok := topics[topic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoTopic, topic)
	}
	return td.Partitions, nil
}

// Topics are the topics a breaker instruction is written to: the breakers
// topic, whose records every router instance applies in offset order (the
// authority for latches), and the decisions topic, on every partition of
// which every instance audits the instruction.
// It reads the Decisions and Breakers fields.
type Topics = topicspec.Topics

// Reset is a person closing a circuit breaker.
type Reset struct {
	Scope    breaker.Scope
	Key      string
	Reason   string
	Operator string
}

// Latch is a person latching a circuit breaker open by hand, until a reset.
type Latch struct {
	Scope    breaker.Scope
	Key      string
	Reason   string
	Operator string
}

// ResetBreaker writes a person's reset in one transaction: its RESET record
// on the breakers topic, which ends every latch item written before it (and
// none written after) and closes the breaker on every instance, in the
// topic's order; and the RESET command on every partition of the decisions
// topic, which every instance audits. It returns the decisions partition
// count.
func ResetBreaker(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topics Topics, r Reset) (int, error) {
	switch {
	case r.Key == "":
		return 0, fmt.Errorf("%w: key", ErrMissing)
	case r.Reason == "":
		return 0, fmt.Errorf("%w: reason", ErrMissing)
	}
	at := event.At(time.Now())
	st := event.BreakerState{Scope: r.Scope.Name(), Key: r.Key, State: breaker.Closed.Name(), Reset: true,
		Reason: r.Reason, UpdatedAt: at, Instance: r.Operator}
	v, err := event.EncodeBreakerState(&st)
	if err != nil {
		return 0, err
	}
	rec := &kgo.Record{Topic: topics.Breakers, Key: []byte(event.BreakerResetKey(st.Scope, st.Key)), Value: v,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(r.Operator)}}}
	e := event.BreakerEvent{Scope: r.Scope.Name(), Key: r.Key, Kind: event.BreakerKindReset, Reason: r.Reason,
		Instance: r.Operator, At: at}
	n, err := writeBreaker(ctx, opts, c, topics, rec, &e)
	if err != nil {
		return 0, fmt.Errorf("control: breaker reset: %w", err)
	}
	return n, nil
}

// LatchBreaker writes a person's latch by hand in one transaction: a latch
// item on the breakers topic (its task ID event.BreakerLatchTask), which
// holds the breaker open on every instance until a RESET written after it,
// and the LATCH command on every partition of the decisions topic, which
// every instance audits. It returns the decisions partition count.
func LatchBreaker(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topics Topics, l Latch) (int, error) {
	switch {
	case l.Key == "":
		return 0, fmt.Errorf("%w: key", ErrMissing)
	case l.Reason == "":
		return 0, fmt.Errorf("%w: reason", ErrMissing)
	case l.Operator == "":
		return 0, fmt.Errorf("%w: operator", ErrMissing)
	}
	at := event.At(time.Now())
	it := event.BreakerItem{Scope: l.Scope.Name(), Key: l.Key, TaskID: event.BreakerLatchTask(l.Operator, at),
		OpenedAt: at, Instance: l.Operator}
	v, err := event.EncodeBreakerItem(&it)
	if err != nil {
		return 0, err
	}
	rec := &kgo.Record{Topic: topics.Breakers, Key: []byte(event.BreakerItemKey(it.Scope, it.Key, it.TaskID)), Value: v,
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(l.Operator)}}}
	e := event.BreakerEvent{Scope: it.Scope, Key: l.Key, Kind: event.BreakerKindLatch, Reason: l.Reason,
		Instance: l.Operator, TaskID: it.TaskID, At: at}
	n, err := writeBreaker(ctx, opts, c, topics, rec, &e)
	if err != nil {
		return 0, fmt.Errorf("control: breaker latch: %w", err)
	}
	return n, nil
}

// writeBreaker writes rec (to the breakers topic) and the command e to
// every partition of the decisions topic in one transaction.
func writeBreaker(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topics Topics, rec *kgo.Record, e *event.BreakerEvent) (int, error) {
	v, err := c.EncodeBreakerEvent(nil, e)
	if err != nil {
		return 0, err
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(deliveryTimeout),
		kgo.TransactionalID("faultrouter-control-"+hex.EncodeToString(id[:])), kgo.TransactionTimeout(deliveryTimeout))...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	parts, err := partitions(ctx, cl, topics.Decisions)
	if err != nil {
		return 0, err
	}
	if _, err := partitions(ctx, cl, topics.Breakers); err != nil {
		return 0, err
	}
	recs := []*kgo.Record{rec}
	for p := range parts {
		recs = append(recs, &kgo.Record{Topic: topics.Decisions, Partition: p, Key: []byte(string(e.Scope) + "/" + e.Key), Value: v})
	}
	if err := cl.BeginTransaction(); err != nil {
		return 0, err
	}
	perr := cl.ProduceSync(ctx, recs...).FirstErr()
	commit := kgo.TransactionEndTry(perr == nil)
	if err := cl.EndTransaction(ctx, commit); err != nil && perr == nil {
		perr = err
	}
	if perr != nil {
		return 0, perr
	}
	return len(parts), nil
}
