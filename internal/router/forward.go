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

// homePartition is the partition a task's records belong on: its key's
// (non-empty) hash. The partitioner reads only the key of rec.
func (r *Router) homePartition(rec *kgo.Record) int32 {
	return int32(r.hash.Partition(rec, int(r.home)))
}

// misplaced reports whether a decoded task event or review decision is on
// the wrong partition for its key, and its home partition.
func (r *Router) misplaced(rec *kgo.Record) (int32, bool) {
	if r.home <= 0 {
		return 0, false
	}
	for _, h := range rec.Headers {
		if h.Key == hdrForwardedFrom {
			return 0, false // forwarded once already: routed where it landed
		}
	}
	home := r.homePartition(rec)
	return home, home != rec.Partition
}

// forward decides a misplaced input and queues its copy on its home
// partition and its audit record.
func (r *Router) forward(in *input, b *batch, now time.Time) {
	rec := in.rec
	in.decision = policy.Forward(in.taskID(), rec.Topic, rec.Partition, in.home, r.home, now)
	h := make([]kgo.RecordHeader, 0, len(rec.Headers)+1)
	h = append(h, rec.Headers...)
	h = append(h, kgo.RecordHeader{Key: hdrForwardedFrom,
		Value: []byte(rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10))})
	b.out = append(b.out, &kgo.Record{Topic: rec.Topic, Partition: in.home, Key: rec.Key, Value: rec.Value,
		Headers: h, Timestamp: rec.Timestamp})
	var ev *event.TaskEvent
	if in.fwd == inputTask {
		ev = &in.event
	}
	b.out = append(b.out, r.audit(b, in, ev))
}

// watchPartitions reads the partition counts every PartitionCheck and
// alerts once for each change (see the top of this file).
func (r *Router) watchPartitions(ctx context.Context, cl *kgo.Client, b *batch, now time.Time) {
	if time.Since(r.partsCheckedAt) < r.cfg.PartitionCheck {
		return
	}
	r.partsCheckedAt = time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pc, err := r.loadPartitions(cctx, cl)
	if err != nil {
		r.log.Warn("cannot read the partition counts; checking again later", "err", err)
		return
	}
	changed := false
	for _, t := range []struct {
		topic    string
		was, now int32
	}{
		{r.cfg.Topics.Ingress, r.seen.ingress, pc.ingress},
		{r.cfg.Topics.Decisions, r.seen.decisions, pc.decisions},
		{r.cfg.Topics.State, r.seen.state, pc.state},
	} {
		r.metrics.partitions.WithLabelValues(t.topic).Set(float64(t.now))
		if t.was == t.now {
			continue
		}
		changed = true
		reason := fmt.Sprintf("partitions of %s changed from %d to %d while routing: tasks keep their home partition "+
			"(murmur2 over %d partitions) and records on other partitions are forwarded there; "+
			"restart every instance together to adopt a new partition count (see README, Partitions)", t.topic, t.was, t.now, r.home)
		r.log.Error("partition count changed", "topic", t.topic, "from", t.was, "to", t.now, "home_partitions", r.home)
		r.brk.alert(b, now, codec.AlertPartitions, event.BreakerEvent{Scope: scopeTopic, Key: t.topic, Kind: event.BreakerKindAlert, Reason: reason,
			Requests: t.now})
	}
	if changed {
		b.parts = &pc
	}
}

// partitionsCommitted takes in the partition counts a committed batch
// alerted about, and refreshes the consumer's metadata so that the group
// consumes the new partitions (a rebalance; after the commit, so that it
// does not abort the batch that carries the alert). A batch that did not
// commit is checked again at once.
func (r *Router) partitionsCommitted(b *batch, cl *kgo.Client, committed bool) {
	if b.parts == nil {
		return
	}
	if !committed {
		r.partsCheckedAt = time.Time{}
		return
	}
	for _, t := range []struct {
		topic    string
		was, now int32
	}{
		{r.cfg.Topics.Ingress, r.seen.ingress, b.parts.ingress},
		{r.cfg.Topics.Decisions, r.seen.decisions, b.parts.decisions},
		{r.cfg.Topics.State, r.seen.state, b.parts.state},
	} {
		if t.was != t.now {
			r.metrics.partitionChanges.WithLabelValues(t.topic).Inc()
		}
	}
	r.seen = *b.parts
	cl.ForceMetadataRefresh()
}
