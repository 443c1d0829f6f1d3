package router

import (
	"context"
	"math"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Record size limits. A record the broker refuses as too large fails the
// whole transaction, and the batch would be polled and refused again
// forever; so the router knows, per topic it writes, the largest record the
// topic takes, and never produces a larger one.
const (
	// defaultMaxMessageBytes is Kafka's default message.max.bytes, used
	// for a topic whose max.message.bytes cannot be read.
	defaultMaxMessageBytes = 1048588
	// recordOverhead is what a record costs in a record batch beyond its
	// key, value and headers: the batch header (61 bytes) and the record's
	// own varints, with room to spare.
	recordOverhead = 512
)

// limits are the largest key+value+headers size, per topic, of a record the
// router may write.
type limits struct {
	byTopic  map[string]int
	batchMax int // the producer's batch bound caps every topic
}

// of returns the limit of topic.
func (l *limits) of(topic string) int {
	m, ok := l.byTopic[topic]
	if !ok {
		m = defaultMaxMessageBytes
	}
	return min(m, l.batchMax) - recordOverhead
}

// recordSize is a record's key, value and headers size.
func recordSize(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 2
	}
	return n
}

// fits reports whether rec fits its topic.
func (l *limits) fits(rec *kgo.Record) bool { return recordSize(rec) <= l.of(rec.Topic) }

// loadLimits reads max.message.bytes of every topic the router writes. A
// topic whose config cannot be read keeps Kafka's default, and says so. The
// producer's batch bound (kgo.ProducerBatchMaxBytes) is the smallest of them:
// a batch of many small records must fit every topic too.
func (r *Router) loadLimits(ctx context.Context) *limits {
	t := r.cfg.Topics
	out := []string{t.Retry, t.Review, t.Audit, t.DeadLetter, t.Alerts, t.State}
	l := &limits{byTopic: map[string]int{}}
	defer func() {
		l.batchMax = math.MaxInt
		for _, topic := range out {
			m, ok := l.byTopic[topic]
			if !ok {
				m = defaultMaxMessageBytes
			}
			l.batchMax = min(l.batchMax, m)
		}
		r.log.Info("record limits", "state", l.of(t.State), "audit", l.of(t.Audit), "deadletter", l.of(t.DeadLetter),
			"retry", l.of(t.Retry), "review", l.of(t.Review), "alerts", l.of(t.Alerts), "producer_batch_max", l.batchMax)
	}()
	cl, err := kgo.NewClient(r.cfg.ClientOpts...)
	if err != nil {
		r.log.Warn("cannot read the topics' max.message.bytes; assuming Kafka's default", "err", err, "default", defaultMaxMessageBytes)
		return l
	}
	defer cl.Close()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, out...)
	if err != nil {
		r.log.Warn("cannot read the topics' max.message.bytes; assuming Kafka's default", "err", err, "default", defaultMaxMessageBytes)
		return l
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			r.log.Warn("cannot read a topic's max.message.bytes; assuming Kafka's default", "topic", rc.Name, "err", rc.Err)
			continue
		}
		for _, c := range rc.Configs {
			if c.Key != "max.message.bytes" || c.Value == nil {
				continue
			}
			if n, err := strconv.Atoi(*c.Value); err == nil && n > 0 {
				l.byTopic[rc.Name] = n
			}
		}
	}
	return l
}
