package checker

import (
	"bytes"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
)

// Forwarded records. The router does not trust the producer's partitioner:
// a task event or review decision on another partition than its task's
// (murmur2 of its key over Options.Partitions, Kafka's default partitioner)
// is audited there (rule partition.forward) and copied, once, to its task's
// partition of the same topic with its key, value and headers and a
// faultrouter.forwarded.from header naming it; the copy is an input of the
// task like any other. A record that carries that header is never forwarded
// again.

var homeHash = kgo.StickyKeyPartitioner(nil).ForTopic("")

// misplaced reports whether rec is on another partition than its task's,
// and its task's partition.
func (c *checker) misplaced(rec *kgo.Record) (int32, bool) {
	if c.o.Partitions <= 0 || hasHeader(rec, codec.HeaderForwardedFrom) {
		return 0, false
	}
	home := int32(homeHash.Partition(rec, int(c.o.Partitions)))
	return home, home != rec.Partition
}

// checkForwarded checks that every misplaced input was copied exactly once
// to its task's partition, unchanged, and that every copy names one.
func (c *checker) checkForwarded() {
	copies := map[inputKey][]*input{}
	for _, in := range c.inputs {
		if !hasHeader(in.rec, codec.HeaderForwardedFrom) {
			continue
		}
		topic, p, o, ok := codec.ParseForwardedFrom(in.rec.Headers)
		if !ok {
			c.violate("forward.header", in.task, "input %s has a %s header that is not topic/partition/offset", in.key, codec.HeaderForwardedFrom)
			continue
		}
		src := inputKey{topic, p, o}
		orig := c.inputs[src]
		switch {
		case orig == nil || orig.kind != inForward:
			c.violate("forward.extra", in.task, "input %s is a forwarded copy of %s, which is no misplaced input", in.key, src)
			continue
		case in.key.topic != src.topic || in.key.partition != orig.home:
			c.violate("forward.partition", in.task, "the copy of %s is on %s/%d, want %s/%d", src, in.key.topic, in.key.partition, src.topic, orig.home)
		case !bytes.Equal(in.rec.Value, orig.rec.Value) || !bytes.Equal(in.rec.Key, orig.rec.Key):
			c.violate("forward.changed", in.task, "the copy %s of %s changed its key or value", in.key, src)
		}
		copies[src] = append(copies[src], in)
	}
	for k, in := range c.inputs {
		if in.kind != inForward || in.audit == nil {
			continue
		}
		switch n := len(copies[k]); {
		case n == 0:
			c.violate("forward.missing", in.task, "input %s was audited as forwarded (%s) but has no copy on partition %d", k, in.audit.r.Decision.Rule, in.home)
		case n > 1:
			c.violate("forward.duplicate", in.task, "input %s was forwarded %d times", k, n)
		}
	}
}

// hasHeader reports whether rec has a header named key.
func hasHeader(rec *kgo.Record, key string) bool {
	for _, h := range rec.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
