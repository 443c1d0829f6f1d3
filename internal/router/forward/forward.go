// Package forward is the router's forwarding, one part of its data path:
// a task's home partition, the copy of a misplaced input on it, and the
// partition counts of the co-partitioned topics, watched while the router
// runs.
package forward

// forward.go: the router does not trust the producer's partitioner. A task's
// home partition is murmur2 of its key (Kafka's default partitioner) over
// the partition count of the state topic when this router process started
// (the home count). A task event or review decision consumed on another
// partition is forwarded to its home partition of the same topic, in the
// batch's transaction, with its original key, value and headers plus
// faultrouter.forwarded.from; it is audited (rule partition.forward) and
// counted, and routed when it is consumed there. A record that was already
// forwarded once is routed where it lands, so that two instances that
// disagree about the home count cannot bounce a record forever. Breaker
// commands are on every decisions partition on purpose and never forwarded.
//
// Partitions added at runtime: every PartitionCheck the router reads the
// partition counts of ingress, decisions and state; a change is logged as an
// error, written as an ALERT (scope TOPIC) to the alerts topic, shown in
// faultrouter_partitions{topic}, and the consumer's metadata is refreshed so
// that the new partitions are consumed. The home count does not change while
// the process runs: records on the new partitions are forwarded into the old
// ones, so every task keeps its partition, its state and its history.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// hdrForwardedFrom is the header a forwarded record carries:
// "<topic>/<partition>/<offset>" of the record it copies.
const hdrForwardedFrom = codec.HeaderForwardedFrom

// scopeTopic is the scope of an alert about a topic.
const scopeTopic = breaker.ScopeTopic

// Out is where the forwarding queues its records: the batch's output.
type Out interface {
	Queue(rec *kgo.Record)
}

// AlertFunc queues an alert of kind on out (the breakers' alerts topic
// records, hold.Breakers.Alert).
type AlertFunc func(out Out, now time.Time, kind string, e event.BreakerEvent)

// Metrics are the forwarding's: faultrouter_partitions and
// faultrouter_partition_changes_total, by topic.
type Metrics struct {
	Partitions *prometheus.GaugeVec
	Changes    *prometheus.CounterVec
}

// Forwarder is the router's forwarding, one part of the data path. It owns
// where a task's records belong: the home partition count, fixed for the
// life of the process, and Kafka's murmur2 partitioner (HomePartition,
// Misplaced); the copy of a misplaced input on its home partition
// (Forward); and the partition counts of ingress, decisions and state, read
// before a session starts (Start, partitioner.go) and every check while it
// runs (WatchPartitions, PartitionsCommitted), with the alert of a change.
// Used by the run loop's goroutine; Misplaced also by the decoding
// goroutines of a batch, which only read it.
type Forwarder struct {
	topics  topicspec.Topics
	check   time.Duration // the router's PartitionCheck
	log     *slog.Logger
	metrics Metrics
	alert   AlertFunc
	// parts are the partition counts of ingress, decisions and state, read
	// before a session starts; seen are the latest counts; home is the
	// partition count a task's home partition is hashed over, fixed for the
	// life of the process; hash is Kafka's murmur2 partitioner. parts is
	// also read by the assignment callbacks, which start after it is set.
	parts, seen Counts
	home        int32
	hash        kgo.TopicPartitioner
	checkedAt   time.Time
}

// New returns the forwarding of topics' records; it reads the partition
// counts every check, and alerts through alert when they change.
func New(topics topicspec.Topics, check time.Duration, log *slog.Logger, m Metrics, alert AlertFunc) *Forwarder {
	return &Forwarder{topics: topics, check: check, log: log, metrics: m, alert: alert,
		hash: kgo.StickyKeyPartitioner(nil).ForTopic("")}
}

// Assume makes c the partition counts, and c.State the home count, as
// Start reads them, without reading them: for a router without a cluster
// (benchmarks).
func (f *Forwarder) Assume(c Counts) {
	f.parts, f.seen, f.home, f.checkedAt = c, c, c.State, time.Now()
}

// Parts are the partition counts read before the session started.
func (f *Forwarder) Parts() Counts { return f.parts }

// HomePartition is the partition a task's records belong on: its key's
// (non-empty) hash.
func (f *Forwarder) HomePartition(key []byte) int32 {
	return int32(f.hash.Partition(&kgo.Record{Key: key}, int(f.home)))
}

// Misplaced reports whether a decoded task event or review decision is on
// the wrong partition for its key, and its home partition.
func (f *Forwarder) Misplaced(rec *kgo.Record) (int32, bool) {
	if f.home <= 0 {
		return 0, false
	}
	for _, h := range rec.Headers {
		if h.Key == hdrForwardedFrom {
			return 0, false // forwarded once already: routed where it landed
		}
	}
	home := int32(f.hash.Partition(rec, int(f.home)))
	return home, home != rec.Partition
}

// Forward decides rec, a misplaced input of task taskID whose home
// partition is home, and returns the decision and its copy for its home
// partition.
func (f *Forwarder) Forward(rec *kgo.Record, taskID string, home int32, now time.Time) (event.Decision, *kgo.Record) {
	d := policy.Forward(taskID, rec.Topic, rec.Partition, home, f.home, now)
	h := make([]kgo.RecordHeader, 0, len(rec.Headers)+1)
	h = append(h, rec.Headers...)
	h = append(h, kgo.RecordHeader{Key: hdrForwardedFrom,
		Value: []byte(rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10))})
	return d, &kgo.Record{Topic: rec.Topic, Partition: home, Key: rec.Key, Value: rec.Value,
		Headers: h, Timestamp: rec.Timestamp}
}

// WatchPartitions reads the partition counts every PartitionCheck and
// alerts once for each change (see the top of this file); it returns the
// new counts the batch alerted about, nil if none.
func (f *Forwarder) WatchPartitions(ctx context.Context, cl *kgo.Client, out Out, now time.Time) *Counts {
	if time.Since(f.checkedAt) < f.check {
		return nil
	}
	f.checkedAt = time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pc, err := f.loadPartitions(cctx, cl)
	if err != nil {
		f.log.Warn("cannot read the partition counts; checking again later", "err", err)
		return nil
	}
	changed := false
	for _, t := range f.since(pc) {
		f.metrics.Partitions.WithLabelValues(t.topic).Set(float64(t.now))
		if t.was == t.now {
			continue
		}
		changed = true
		reason := fmt.Sprintf("partitions of %s changed from %d to %d while routing: tasks keep their home partition "+
			"(murmur2 over %d partitions) and records on other partitions are forwarded there; "+
			"restart every instance together to adopt a new partition count (see docs/data-path.md, Adding partitions)", t.topic, t.was, t.now, f.home)
		f.log.Error("partition count changed", "topic", t.topic, "from", t.was, "to", t.now, "home_partitions", f.home)
		f.alert(out, now, codec.AlertPartitions, event.BreakerEvent{Scope: scopeTopic, Key: t.topic, Kind: event.BreakerKindAlert, Reason: reason,
			Requests: t.now})
	}
	if !changed {
		return nil
	}
	return &pc
}

// PartitionsCommitted takes in the partition counts a committed batch
// alerted about (pc, WatchPartitions), and refreshes the consumer's
// metadata so that the group consumes the new partitions (a rebalance;
// after the commit, so that it does not abort the batch that carries the
// alert). A batch that did not commit is checked again at once.
func (f *Forwarder) PartitionsCommitted(pc *Counts, cl *kgo.Client, committed bool) {
	if pc == nil {
		return
	}
	if !committed {
		f.checkedAt = time.Time{}
		return
	}
	for _, t := range f.since(*pc) {
		if t.was != t.now {
			f.metrics.Changes.WithLabelValues(t.topic).Inc()
		}
	}
	f.seen = *pc
	cl.ForceMetadataRefresh()
}

// countChange is a topic's partition count as last seen (was) and as read
// (now).
type countChange struct {
	topic    string
	was, now int32
}

// since pairs the counts last seen with pc, topic by topic.
func (f *Forwarder) since(pc Counts) [3]countChange {
	return [3]countChange{
		{f.topics.Ingress, f.seen.Ingress, pc.Ingress},
		{f.topics.Decisions, f.seen.Decisions, pc.Decisions},
		{f.topics.State, f.seen.State, pc.State},
	}
}
