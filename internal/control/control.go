// Package control writes an operator's instructions to Kafka: a reviewer's
// decision on the decisions topic, a breaker reset on every partition of the
// decisions topic, and a re-drive of dead-letter or review records to
// ingress in one transaction. The CLI verbs (review decide, breaker reset,
// replay --redrive-to) and the operator console (internal/console) write through
// it; the router reads and audits what it writes.
package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
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

// Reset is a person closing a circuit breaker.
type Reset struct {
	Scope    breaker.Scope
	Key      string
	Reason   string
	Operator string
}

// ResetBreaker writes the reset to every partition of the decisions topic,
// so every router instance receives it, and returns the partition count.
func ResetBreaker(ctx context.Context, opts []kgo.Opt, c *codec.Codec, topic string, r Reset) (int, error) {
	switch {
	case r.Key == "":
		return 0, fmt.Errorf("%w: key", ErrMissing)
	case r.Reason == "":
		return 0, fmt.Errorf("%w: reason", ErrMissing)
	}
	e := event.BreakerEvent{Scope: r.Scope.String(), Key: r.Key, Kind: router.BreakerKindReset, Reason: r.Reason,
		Instance: r.Operator, At: event.At(time.Now())}
	v, err := c.EncodeBreakerEvent(nil, &e)
	if err != nil {
		return 0, err
	}
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(deliveryTimeout))...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	parts, err := partitions(ctx, cl, topic)
	if err != nil {
		return 0, fmt.Errorf("control: breaker reset: %w", err)
	}
	recs := make([]*kgo.Record, 0, len(parts))
	for p := range parts {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Key: []byte(e.Scope + "/" + r.Key), Value: v})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("control: breaker reset: %w", err)
	}
	return len(recs), nil
}
