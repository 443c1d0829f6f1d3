package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// reader reads the routed records of one output topic in a consumer group,
// at least once: a record's offset is committed only after the caller asks
// for the next one (or closes), so a worker that dies while handling a
// record gets it again.
type reader struct {
	cl      *kgo.Client
	codec   *codec.Codec
	topic   string
	fetched []*kgo.Record
	handed  *kgo.Record // returned by the last next, marked on the following call
}

func newReader(cfg Config, short topicspec.Short, group string) (*reader, map[topicspec.Short]string, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if group == "" {
		return nil, nil, fmt.Errorf("%w: the consumer group is empty", ErrConfig)
	}
	topics, err := cfg.topics()
	if err != nil {
		return nil, nil, err
	}
	c, err := codec.New()
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(append(cfg.ClientOpts,
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics[short]),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), // a new group starts at the beginning
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),      // only what the router committed
		kgo.AutoCommitMarks(),
	)...)
	if err != nil {
		return nil, nil, fmt.Errorf("worker: %w", err)
	}
	return &reader{cl: cl, codec: c, topic: topics[short]}, topics, nil
}

// next returns the next routed record and the Kafka record it came from. A
// record that does not decode is returned as an error (and counts as
// handled); the following call goes on after it.
func (r *reader) next(ctx context.Context) (event.Routed, *kgo.Record, error) {
	if r.handed != nil {
		r.cl.MarkCommitRecords(r.handed)
		r.handed = nil
	}
	for len(r.fetched) == 0 {
		fs := r.cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return event.Routed{}, nil, err
		}
		if fs.IsClientClosed() {
			return event.Routed{}, nil, fmt.Errorf("worker: %s: client closed", r.topic)
		}
		r.fetched = fs.Records()
		if errs := fs.Errors(); len(errs) > 0 && len(r.fetched) == 0 {
			return event.Routed{}, nil, fmt.Errorf("worker: fetch %s: %w", r.topic, errs[0].Err)
		}
	}
	rec := r.fetched[0]
	r.fetched = r.fetched[1:]
	r.handed = rec
	routed, err := r.codec.DecodeRouted(rec.Value)
	if err != nil {
		return event.Routed{}, rec, fmt.Errorf("worker: %s partition %d offset %d: %w", r.topic, rec.Partition, rec.Offset, err)
	}
	return routed, rec, nil
}

// close commits what was handed out and leaves the group.
func (r *reader) close() {
	if r.handed != nil {
		r.cl.MarkCommitRecords(r.handed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r.cl.CommitMarkedOffsets(ctx)
	r.cl.Close()
}
