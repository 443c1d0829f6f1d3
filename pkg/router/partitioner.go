package router

import "github.com/twmb/franz-go/pkg/kgo"

// partitioner sends changelog records to the partition set on the record
// (the task's ingress partition) and hashes the key like the Java client
// (murmur2) for every other topic.
type partitioner struct {
	state  string
	manual kgo.Partitioner
	keyed  kgo.Partitioner
}

func newPartitioner(stateTopic string) kgo.Partitioner {
	return partitioner{state: stateTopic, manual: kgo.ManualPartitioner(), keyed: kgo.StickyKeyPartitioner(nil)}
}

func (p partitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == p.state {
		return p.manual.ForTopic(topic)
	}
	return p.keyed.ForTopic(topic)
}
