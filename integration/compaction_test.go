package integration

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// The checker's runs route while Kafka's log cleaner compacts the state
// changelog and the breakers topic under them: once the first router has
// created them (as its build does, from its topics/), they get cleaner
// settings that make the cleaner work within seconds (cleanerConfigs). A
// watcher reads both topics as they are written, from before the cleaner
// may remove anything, so that what the cleaner removed can be told after
// the run, and so that the checker sees every tombstone the router wrote,
// also those the cleaner removed before the logs were read.

// cleanerConfigs are the compacted topics' settings in a checker run: a
// segment is closed (and so cleanable) a few seconds after it began, the
// cleaner takes a log with almost any dirty share at once, and a tombstone
// is removed 45 s after the cleaner first passed it: those of a run's
// first half are gone when it ends, so a restart reads states whose
// tombstones it never sees, and those of its last minute are still there
// when its last instance restores, where a tombstone followed by the
// task's next state must give that state. The broker's cleaner looks for
// work every second (kafka.sh).
var cleanerConfigs = map[string]string{
	"segment.ms":                "3000",
	"min.cleanable.dirty.ratio": "0.01",
	"min.compaction.lag.ms":     "0",
	"delete.retention.ms":       "45000",
}

// compactWhileRouting gives the topics (they exist: the first router
// created them as its build does) the cleaner settings, and checks that
// the broker took them.
func compactWhileRouting(ctx context.Context, t *testing.T, topics ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var alter []kadm.AlterConfig
	for _, k := range slices.Sorted(maps.Keys(cleanerConfigs)) {
		alter = append(alter, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: kadm.StringPtr(cleanerConfigs[k])})
	}
	resps, err := adm.AlterTopicConfigs(ctx, alter, topics...)
	if err != nil {
		t.Fatalf("set the cleaner's settings of %v: %v", topics, err)
	}
	for _, r := range resps {
		if r.Err != nil {
			t.Fatalf("set the cleaner's settings of %s: %v %s", r.Name, r.Err, r.ErrMessage)
		}
	}
	// the broker applies a change when it replays the metadata record: a
	// describe right after the alter may still show the old value
	var bad string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rcs, err := adm.DescribeTopicConfigs(ctx, topics...)
		if err != nil {
			t.Fatalf("describe %v: %v", topics, err)
		}
		bad = ""
		for _, rc := range rcs {
			got := map[string]string{}
			for _, c := range rc.Configs {
				if c.Value != nil {
					got[c.Key] = *c.Value
				}
			}
			for k, v := range cleanerConfigs {
				if got[k] != v && bad == "" {
					bad = fmt.Sprintf("%s: %s is %q after it was set to %q (%v)", rc.Name, k, got[k], v, rc.Err)
				}
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(bad)
		}
	}
}

// createCompactedTopics creates the state changelog and the breakers topic
// of e as this build's routers would with --partitions partitions, with the
// cleaner settings, before a router creates them from topics/ (a test
// whose routers are all of this build). It returns their names.
func createCompactedTopics(ctx context.Context, t *testing.T, e *env, partitions int32) (state, breakers string) {
	t.Helper()
	set, err := topicspec.Load(e.prefix)
	if err != nil {
		t.Fatal(err)
	}
	set = set.WithPartitions(partitions)
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	var names []string
	for _, short := range []topicspec.Short{topicspec.State, topicspec.Breakers} {
		sp, err := set.Spec(short)
		if err != nil {
			t.Fatal(err)
		}
		configs := map[string]*string{}
		for k, v := range sp.Configs {
			configs[k] = kadm.StringPtr(v)
		}
		for k, v := range cleanerConfigs {
			configs[k] = kadm.StringPtr(v)
		}
		if _, err := adm.CreateTopic(ctx, sp.Partitions, sp.ReplicationFactor, configs, sp.Name); err != nil {
			t.Fatalf("create %s with the cleaner's settings: %v", sp.Name, err)
		}
		names = append(names, sp.Name)
	}
	return names[0], names[1]
}

// topicWatch reads topics from their start as they are written, with
// read_committed, until stopped: it counts each partition's data records
// and keeps the tombstones.
type topicWatch struct {
	topics []string
	cancel context.CancelFunc
	done   chan struct{}

	mu         sync.Mutex
	next       map[string]map[int32]int64 // where the read of each partition stands
	records    map[string]map[int32]int   // data records read, tombstones included
	tombstones map[string][]*kgo.Record
	errs       int
	lastErr    error
}

// watchTopics starts a watch of topics (they exist).
func watchTopics(topics ...string) *topicWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &topicWatch{topics: topics, cancel: cancel, done: make(chan struct{}),
		next: map[string]map[int32]int64{}, records: map[string]map[int32]int{}, tombstones: map[string][]*kgo.Record{}}
	go w.run(ctx)
	return w
}

func (w *topicWatch) run(ctx context.Context) {
	defer close(w.done)
	seeds := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.FetchMaxBytes(64 << 20)}
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		w.fail(err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for ctx.Err() == nil {
		if !w.step(ctx, adm, seeds) {
			select {
			case <-ctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}
}

// step reads every partition from where it stands to its committed end now,
// and reports whether it read anything. A partition new to the watch is
// read from its log start.
func (w *topicWatch) step(ctx context.Context, adm *kadm.Client, seeds []kgo.Opt) bool {
	ends, err := adm.ListCommittedOffsets(ctx, w.topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		w.fail(err)
		return false
	}
	var starts kadm.ListedOffsets
	ranges := scan.Ranges{}
	w.mu.Lock()
	for _, e := range sortedOffsets(ends) {
		from, ok := w.next[e.Topic][e.Partition]
		if !ok {
			w.mu.Unlock()
			if starts == nil {
				if starts, err = adm.ListStartOffsets(ctx, w.topics...); err == nil {
					err = starts.Error()
				}
				if err != nil {
					w.fail(err)
					return false
				}
			}
			w.mu.Lock()
			s, _ := starts.Lookup(e.Topic, e.Partition)
			from = max(0, s.Offset)
			if w.next[e.Topic] == nil {
				w.next[e.Topic], w.records[e.Topic] = map[int32]int64{}, map[int32]int{}
			}
			w.next[e.Topic][e.Partition] = from
		}
		if from < e.Offset {
			ranges.Set(e.Topic, e.Partition, scan.Range{Start: from, End: e.Offset})
		}
	}
	w.mu.Unlock()
	if len(ranges) == 0 {
		return false
	}
	// a read waits for a record at or past the end: the router keeps
	// committing while it runs, and a read cut short goes on next step
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = scan.Read(rctx, seeds, ranges, func(b *scan.Batch) error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, rec := range b.Records {
			w.records[rec.Topic][rec.Partition]++
			if rec.Value == nil {
				w.tombstones[rec.Topic] = append(w.tombstones[rec.Topic], rec)
			}
		}
		for topic, ps := range b.Next {
			for p, n := range ps {
				w.next[topic][p] = max(w.next[topic][p], n)
			}
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		w.fail(err)
	}
	return true
}

func (w *topicWatch) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs++
	w.lastErr = err
}

// caughtUp waits, up to d, until the watch has read every partition of its
// topics to its committed end as of the call.
func (w *topicWatch) caughtUp(ctx context.Context, t *testing.T, d time.Duration) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var ends kadm.ListedOffsets
	if !waitFor(d, func() bool {
		ends, err = kadm.NewClient(cl).ListCommittedOffsets(ctx, w.topics...)
		return err == nil && ends.Error() == nil
	}) {
		t.Fatalf("committed ends of %v: %v", w.topics, err)
	}
	behind := func() []string {
		w.mu.Lock()
		defer w.mu.Unlock()
		var short []string
		for _, e := range sortedOffsets(ends) {
			if n, ok := w.next[e.Topic][e.Partition]; !ok || n < e.Offset {
				short = append(short, fmt.Sprintf("%s/%d at %d of %d", e.Topic, e.Partition, n, e.Offset))
			}
		}
		return short
	}
	if !waitFor(d, func() bool { return len(behind()) == 0 }) {
		w.mu.Lock()
		errs, last := w.errs, w.lastErr
		w.mu.Unlock()
		t.Fatalf("the watch of %v did not read to the committed ends within %s: %s (%d read errors, the last: %v)",
			w.topics, d, strings.Join(behind(), ", "), errs, last)
	}
}

// tombstonesOf returns the tombstones read of topic so far, by partition
// and offset.
func (w *topicWatch) tombstonesOf(topic string) []*kgo.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.tombstones[topic])
}

// stop ends the watch.
func (w *topicWatch) stop() {
	w.cancel()
	<-w.done
}

// sortedOffsets lists l by topic and partition.
func sortedOffsets(l kadm.ListedOffsets) []kadm.ListedOffset {
	var out []kadm.ListedOffset
	l.Each(func(o kadm.ListedOffset) { out = append(out, o) })
	slices.SortFunc(out, func(a, b kadm.ListedOffset) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// withTombstones returns the tombstones of recs and those of more that recs
// lacks (by partition and offset), in partition and offset order.
func withTombstones(recs, more []*kgo.Record) []*kgo.Record {
	type at struct {
		p   int32
		off int64
	}
	seen := map[at]bool{}
	out := []*kgo.Record{}
	for _, rs := range [][]*kgo.Record{recs, more} {
		for _, r := range rs {
			if r.Value == nil && !seen[at{r.Partition, r.Offset}] {
				seen[at{r.Partition, r.Offset}] = true
				out = append(out, r)
			}
		}
	}
	slices.SortFunc(out, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	return out
}

// cleaned is what the log cleaner removed of one topic: the committed data
// records (tombstones included) the watch read as they were written, and
// those a read from the log start finds after the run.
type cleaned struct {
	topic                     string
	written, left             int // data records
	tombstones, tombstonesNow int
	parts                     []cleanedPart
}

// cleanedPart is one partition of cleaned.
type cleanedPart struct {
	p              int32
	written, left  int
	start, end     int64 // log start offset and high watermark
	first, missing int64 // the first offset a read finds, and how many below the last one it finds are not there
}

// removed is how many committed records the cleaner removed.
func (c cleaned) removed() int { return c.written - c.left }

func (c cleaned) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d committed records written (%d tombstones), %d left after the cleaner (%d tombstones): %d removed",
		c.topic, c.written, c.tombstones, c.left, c.tombstonesNow, c.removed())
	for _, p := range c.parts {
		fmt.Fprintf(&b, "; p%d %d->%d (log start %d, end %d, first record at %d, %d offsets below the last record hold none)",
			p.p, p.written, p.left, p.start, p.end, p.first, p.missing)
	}
	return b.String()
}

// cleanerReport compares what the watch read of topic (caught up) with a
// read of it from its start now.
func cleanerReport(ctx context.Context, t *testing.T, w *topicWatch, topic string) cleaned {
	t.Helper()
	recs := readTopic(ctx, t, topic, true)
	c := cleaned{topic: topic}
	w.mu.Lock()
	written := maps.Clone(w.records[topic])
	c.tombstones = len(w.tombstones[topic])
	w.mu.Unlock()
	left := map[int32][]*kgo.Record{}
	for _, r := range recs {
		left[r.Partition] = append(left[r.Partition], r)
		if r.Value == nil {
			c.tombstonesNow++
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range slices.Sorted(maps.Keys(written)) {
		cp := cleanedPart{p: p, written: written[p], left: len(left[p]), first: -1}
		if s, ok := starts.Lookup(topic, p); ok {
			cp.start = s.Offset
		}
		if e, ok := ends.Lookup(topic, p); ok {
			cp.end = e.Offset
		}
		if rs := left[p]; len(rs) > 0 {
			cp.first = rs[0].Offset
			cp.missing = rs[len(rs)-1].Offset + 1 - int64(len(rs))
		}
		c.written += cp.written
		c.left += cp.left
		c.parts = append(c.parts, cp)
	}
	return c
}
