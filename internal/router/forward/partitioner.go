package forward

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// partitioner sends the records whose partition the router chooses itself
// (state changelog records: the task's partition; breaker commands on
// decisions: every partition; forwarded input: the task's partition) to the
// partition set on the record, and hashes the key like the Java client
// (murmur2) for every other topic.
type partitioner struct {
	placed map[string]bool
	manual kgo.Partitioner
	keyed  kgo.Partitioner
}

// NewPartitioner returns the router's producer partitioner: the records of
// the placed topics go to the partition set on them.
func NewPartitioner(placed ...string) kgo.Partitioner {
	m := map[string]bool{}
	for _, t := range placed {
		m[t] = true
	}
	return partitioner{placed: m, manual: kgo.ManualPartitioner(), keyed: kgo.StickyKeyPartitioner(nil)}
}

func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if p.placed[topic] {
		return p.manual.ForTopic(topic)
	}
	return p.keyed.ForTopic(topic)
}

// Counts are the partition counts of the co-partitioned topics.
type Counts struct {
	Ingress, Decisions, State int32
}

// loadPartitions reads the partition counts of ingress, decisions and state.
func (f *Forwarder) loadPartitions(ctx context.Context, cl *kgo.Client) (Counts, error) {
	t := f.topics
	td, err := kadm.NewClient(cl).ListTopics(ctx, t.Ingress, t.Decisions, t.State)
	if err != nil {
		return Counts{}, fmt.Errorf("router: partitions of %s, %s, %s: %w", t.Ingress, t.Decisions, t.State, err)
	}
	n := func(topic string) (int32, error) {
		d, ok := td[topic]
		if !ok || d.Err != nil || len(d.Partitions) == 0 {
			return 0, fmt.Errorf("router: topic %s: no partitions (%v)", topic, d.Err)
		}
		return int32(len(d.Partitions)), nil
	}
	var pc Counts
	if pc.Ingress, err = n(t.Ingress); err != nil {
		return pc, err
	}
	if pc.Decisions, err = n(t.Decisions); err != nil {
		return pc, err
	}
	pc.State, err = n(t.State)
	return pc, err
}

// Start reads the partition counts before a session starts; the first
// session of the process fixes the home count (forward.go).
func (f *Forwarder) Start(ctx context.Context, clientOpts []kgo.Opt) error {
	cl, err := kgo.NewClient(clientOpts...)
	if err != nil {
		return fmt.Errorf("router: client: %w", err)
	}
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pc, err := f.loadPartitions(cctx, cl)
	if err != nil {
		return err
	}
	if f.home == 0 {
		f.home = pc.State
	} else if pc.State != f.home {
		f.log.Error("the state topic's partition count differs from the one this process started with; tasks keep their home partitions",
			"partitions", pc.State, "home_partitions", f.home)
	}
	f.parts, f.seen, f.checkedAt = pc, pc, time.Now()
	return nil
}
