package integration

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// The checker decides latches by the offsets of the breakers topic
// (checker.Logs.Breakers). The topic is compacted while the routers run:
// once an item's tombstone is written the log cleaner may remove its open
// record, once a later RESET of a breaker is written the earlier one, and
// the tombstones themselves some seconds after. A read after the run would
// miss what held a template during it. So a checker run reads the topic as
// it is written, from offset 0, starting before the first router: every
// record, read_uncommitted with the transactions' control records, which
// the checker needs to resolve the transactions (a COMMIT marker's time is
// when the records became readable) and to tell the offsets it never read
// (a record the cleaner removed before this read got to it leaves a gap
// there, and the checker leaves the latches it may have ended unchecked).

// breakerCapture reads one run's breakers topic as it is written.
type breakerCapture struct {
	topic  string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	recs    []*kgo.Record
	next    map[int32]int64 // per partition, the offset after the last record read
	errs    int
	lastErr error
}

// captures are the running captures, by topic prefix (readLogs takes its
// run's from here).
var captures sync.Map

// captureBreakers starts reading e's breakers topic from offset 0 (the
// topic may not exist yet: the read begins once it does) until the test
// ends.
func captureBreakers(t *testing.T, e *env) *breakerCapture {
	t.Helper()
	set, err := topicspec.Load(e.prefix)
	if err != nil {
		t.Fatal(err)
	}
	topic, err := set.Name("breakers")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadUncommitted()), kgo.KeepControlRecords(),
		kgo.MetadataMinAge(250*time.Millisecond), kgo.FetchMaxWait(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &breakerCapture{topic: topic, cancel: cancel, done: make(chan struct{}), next: map[int32]int64{}}
	go c.run(ctx, cl)
	captures.Store(e.prefix, c)
	t.Cleanup(func() {
		c.stop()
		captures.Delete(e.prefix)
	})
	return c
}

func (c *breakerCapture) run(ctx context.Context, cl *kgo.Client) {
	defer close(c.done)
	defer cl.Close()
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		fs.EachError(func(_ string, _ int32, err error) {
			c.errs++
			c.lastErr = err
		})
		fs.EachRecord(func(r *kgo.Record) {
			c.recs = append(c.recs, r)
			c.next[r.Partition] = max(c.next[r.Partition], r.Offset+1)
		})
		c.mu.Unlock()
	}
}

func (c *breakerCapture) stop() {
	c.cancel()
	<-c.done
}

// records waits, up to two minutes, until the capture has read the topic
// to its end offsets as of the call, and returns every record read.
func (c *breakerCapture) records(ctx context.Context, t *testing.T) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var ends kadm.ListedOffsets
	if !waitFor(2*time.Minute, func() bool {
		ends, err = kadm.NewClient(cl).ListEndOffsets(ctx, c.topic)
		return err == nil && ends.Error() == nil
	}) {
		t.Fatalf("the end offsets of %s: %v", c.topic, err)
	}
	caught := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		ok := true
		ends.Each(func(o kadm.ListedOffset) { ok = ok && c.next[o.Partition] >= o.Offset })
		return ok
	}
	if !waitFor(2*time.Minute, caught) {
		c.mu.Lock()
		defer c.mu.Unlock()
		want := map[int32]int64{}
		ends.Each(func(o kadm.ListedOffset) { want[o.Partition] = o.Offset })
		t.Fatalf("the capture of %s did not read to its end offsets %v within 2 min: at %v (%d fetch errors, the last: %v)",
			c.topic, want, c.next, c.errs, c.lastErr)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

// capturedBreakers is the breakers topic as the capture of e's run read it
// (captureBreakers), nil when the run has none.
func capturedBreakers(ctx context.Context, t *testing.T, e *env) []*kgo.Record {
	t.Helper()
	c, ok := captures.Load(e.prefix)
	if !ok {
		return nil
	}
	return c.(*breakerCapture).records(ctx, t)
}
