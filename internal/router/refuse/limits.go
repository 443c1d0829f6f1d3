package refuse

import (
	"context"
	"log/slog"
	"math"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
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

// Limits are the largest key+value+headers size, per topic, of a record the
// router may write.
type Limits struct {
	byTopic map[string]int
	// BatchMax is the producer's batch bound (kgo.ProducerBatchMaxBytes):
	// it caps every topic
	BatchMax int
}

// Of returns the limit of topic.
func (l *Limits) Of(topic string) int {
	m, ok := l.byTopic[topic]
	if !ok {
		m = defaultMaxMessageBytes
	}
	return min(m, l.BatchMax) - recordOverhead
}

// Size is a record's key, value and headers size.
func Size(rec *kgo.Record) int {
	n := len(rec.Key) + len(rec.Value)
	for _, h := range rec.Headers {
		n += len(h.Key) + len(h.Value) + 2
	}
	return n
}

// Fits reports whether rec fits its topic.
func (l *Limits) Fits(rec *kgo.Record) bool { return Size(rec) <= l.Of(rec.Topic) }

// Load reads max.message.bytes of topics, every topic the router writes,
// with a client of opts. A
// topic whose config cannot be read keeps Kafka's default, and says so. The
// producer's batch bound (kgo.ProducerBatchMaxBytes) is the smallest of them:
// a batch of many small records must fit every topic too.
func Load(ctx context.Context, t topicspec.Topics, opts []kgo.Opt, log *slog.Logger) *Limits {
	out := []string{t.Retry, t.Review, t.Audit, t.DeadLetter, t.Alerts, t.State}
	l := &Limits{byTopic: map[string]int{}}
	defer func() {
		l.BatchMax = math.MaxInt
		for _, topic := range out {
			m, ok := l.byTopic[topic]
			if !ok {
				m = defaultMaxMessageBytes
			}
			l.BatchMax = min(l.BatchMax, m)
		}
		log.Info("record limits", "state", l.Of(t.State), "audit", l.Of(t.Audit), "deadletter", l.Of(t.DeadLetter),
			"retry", l.Of(t.Retry), "review", l.Of(t.Review), "alerts", l.Of(t.Alerts), "producer_batch_max", l.BatchMax)
	}()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		log.Warn("cannot read the topics' max.message.bytes; assuming Kafka's default", "err", err, "default", defaultMaxMessageBytes)
		return l
	}
	defer cl.Close()
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, out...)
	if err != nil {
		log.Warn("cannot read the topics' max.message.bytes; assuming Kafka's default", "err", err, "default", defaultMaxMessageBytes)
		return l
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			log.Warn("cannot read a topic's max.message.bytes; assuming Kafka's default", "topic", rc.Name, "err", rc.Err)
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

// Defaults are the limits of topics whose configs were not read: Kafka's
// default max.message.bytes for every topic.
func Defaults() *Limits { return &Limits{byTopic: map[string]int{}, BatchMax: defaultMaxMessageBytes} }
