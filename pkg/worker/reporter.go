package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Reporter sends attempt outcomes to the ingress topic. It is safe for
// concurrent use.
type Reporter struct {
	cl     *kgo.Client
	codec  *codec.Codec
	topic  string
	source string
}

// NewReporter returns a Reporter. Its producer is idempotent (a send retried
// after a lost acknowledgement is written once) and hashes keys like the
// Java client.
func NewReporter(cfg Config) (*Reporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	topics, err := cfg.topics()
	if err != nil {
		return nil, err
	}
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	// franz-go's defaults are the contract: idempotent writes, acks from all
	// in-sync replicas, murmur2 key hashing (the sticky key partitioner).
	cl, err := kgo.NewClient(append(cfg.ClientOpts, kgo.DefaultProduceTopic(topics[topicspec.Ingress]))...)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	source := cfg.Source
	if source == "" {
		source = "worker"
	}
	return &Reporter{cl: cl, codec: c, topic: topics[topicspec.Ingress], source: source}, nil
}

// Report sends events to the ingress topic, each keyed by its task ID, and
// returns when all are acknowledged. It fills in what a worker may leave
// out: EventID (a random ID), OccurredAt (now) and Source (Config.Source),
// in place, so the caller sees what was sent. An event that is invalid even
// so is an error naming the event and the field (an *event.FieldError
// inside), and then nothing is sent.
func (r *Reporter) Report(ctx context.Context, events ...*event.TaskEvent) error {
	recs := make([]*kgo.Record, len(events))
	for i, e := range events {
		if e.EventID == "" {
			e.EventID = newID()
		}
		if e.OccurredAt.IsZero() {
			e.OccurredAt = event.At(time.Now())
		}
		if e.Source == "" {
			e.Source = r.source
		}
		v, err := r.codec.EncodeTaskEvent(nil, e)
		if err != nil {
			return fmt.Errorf("worker: event %d (task %q): %w", i, e.TaskID, err)
		}
		recs[i] = &kgo.Record{Key: []byte(e.TaskID), Value: v}
	}
	if err := r.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("worker: report to %s: %w", r.topic, err)
	}
	return nil
}

// Close flushes nothing (Report waits for its records) and closes the client.
func (r *Reporter) Close() { r.cl.Close() }

// newID returns 16 random bytes in hex: a unique event ID.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
