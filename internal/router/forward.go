package router

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

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// hdrForwardedFrom is the header a forwarded record carries:
// "<topic>/<partition>/<offset>" of the record it copies.
const hdrForwardedFrom = codec.HeaderForwardedFrom

// scopeTopic is the scope of an alert about a topic.
const scopeTopic = breaker.ScopeTopic

// forwarder is the router's forwarding, one part of the data path. It owns
// where a task's records belong: the home partition count, fixed for the
// life of the process, and Kafka's murmur2 partitioner (homePartition,
// misplaced); the copy of a misplaced input on its home partition
// (forward); and the partition counts of ingress, decisions and state, read
// before a session starts (start, partitioner.go) and every PartitionCheck
// while it runs (watchPartitions, partitionsCommitted), with the alert of a
// change, which goes out through the breakers' alerts (an alerter). Used by
// the run loop's goroutine; misplaced also by the decoding goroutines of a
// batch, which only read it.
type forwarder struct {
	topics Topics
	check  time.Duration // Config.PartitionCheck
	log    *slog.Logger
	// metrics are the router's: faultrouter_partitions and
	// faultrouter_partition_changes_total
	metrics *metrics
	alerts  alerter
	// parts are the partition counts of ingress, decisions and state, read
	// before a session starts; seen are the latest counts; home is the
	// partition count a task's home partition is hashed over, fixed for the
	// life of the process; hash is Kafka's murmur2 partitioner. parts is
	// also read by the assignment callbacks, which start after it is set.
	parts, seen partitionCounts
	home        int32
	hash        kgo.TopicPartitioner
	checkedAt   time.Time
}

// alerter queues an alert on the alerts topic (hold.Breakers.Alert).
type alerter interface {
	Alert(out recordsOut, now time.Time, kind string, e event.BreakerEvent)
}

func newForwarder(cfg *Config, log *slog.Logger, m *metrics, alerts alerter) forwarder {
	return forwarder{topics: cfg.Topics, check: cfg.PartitionCheck, log: log, metrics: m, alerts: alerts,
		hash: kgo.StickyKeyPartitioner(nil).ForTopic("")}
}

// homePartition is the partition a task's records belong on: its key's
// (non-empty) hash. The partitioner reads only the key of rec.
func (f *forwarder) homePartition(rec *kgo.Record) int32 {
	return int32(f.hash.Partition(rec, int(f.home)))
}

// misplaced reports whether a decoded task event or review decision is on
// the wrong partition for its key, and its home partition.
func (f *forwarder) misplaced(rec *kgo.Record) (int32, bool) {
	if f.home <= 0 {
		return 0, false
	}
	for _, h := range rec.Headers {
		if h.Key == hdrForwardedFrom {
			return 0, false // forwarded once already: routed where it landed
		}
	}
	home := f.homePartition(rec)
	return home, home != rec.Partition
}

// forward decides a misplaced input and returns its copy for its home
// partition.
func (f *forwarder) forward(in *input, now time.Time) *kgo.Record {
	rec := in.rec
	in.decision = policy.Forward(in.taskID(), rec.Topic, rec.Partition, in.home, f.home, now)
	h := make([]kgo.RecordHeader, 0, len(rec.Headers)+1)
	h = append(h, rec.Headers...)
	h = append(h, kgo.RecordHeader{Key: hdrForwardedFrom,
		Value: []byte(rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10))})
	return &kgo.Record{Topic: rec.Topic, Partition: in.home, Key: rec.Key, Value: rec.Value,
		Headers: h, Timestamp: rec.Timestamp}
}

// watchPartitions reads the partition counts every PartitionCheck and
// alerts once for each change (see the top of this file); it returns the
// new counts the batch alerted about, nil if none.
func (f *forwarder) watchPartitions(ctx context.Context, cl *kgo.Client, out recordsOut, now time.Time) *partitionCounts {
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
	for _, t := range []struct {
		topic    string
		was, now int32
	}{
		{f.topics.Ingress, f.seen.ingress, pc.ingress},
		{f.topics.Decisions, f.seen.decisions, pc.decisions},
		{f.topics.State, f.seen.state, pc.state},
	} {
		f.metrics.partitions.WithLabelValues(t.topic).Set(float64(t.now))
		if t.was == t.now {
			continue
		}
		changed = true
		reason := fmt.Sprintf("partitions of %s changed from %d to %d while routing: tasks keep their home partition "+
			"(murmur2 over %d partitions) and records on other partitions are forwarded there; "+
			"restart every instance together to adopt a new partition count (see docs/data-path.md, Adding partitions)", t.topic, t.was, t.now, f.home)
		f.log.Error("partition count changed", "topic", t.topic, "from", t.was, "to", t.now, "home_partitions", f.home)
		f.alerts.Alert(out, now, codec.AlertPartitions, event.BreakerEvent{Scope: scopeTopic, Key: t.topic, Kind: event.BreakerKindAlert, Reason: reason,
			Requests: t.now})
	}
	if !changed {
		return nil
	}
	return &pc
}

// partitionsCommitted takes in the partition counts a committed batch
// alerted about (pc, watchPartitions), and refreshes the consumer's
// metadata so that the group consumes the new partitions (a rebalance;
// after the commit, so that it does not abort the batch that carries the
// alert). A batch that did not commit is checked again at once.
func (f *forwarder) partitionsCommitted(pc *partitionCounts, cl *kgo.Client, committed bool) {
	if pc == nil {
		return
	}
	if !committed {
		f.checkedAt = time.Time{}
		return
	}
	for _, t := range []struct {
		topic    string
		was, now int32
	}{
		{f.topics.Ingress, f.seen.ingress, pc.ingress},
		{f.topics.Decisions, f.seen.decisions, pc.decisions},
		{f.topics.State, f.seen.state, pc.state},
	} {
		if t.was != t.now {
			f.metrics.partitionChanges.WithLabelValues(t.topic).Inc()
		}
	}
	f.seen = *pc
	cl.ForceMetadataRefresh()
}
