package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/scan"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// breakerRecord is the latest record of one key of the breakers topic, as
// a router reading it from its start sees it.
type breakerRecord struct {
	offset int64
	live   bool   // not a tombstone
	writer string // the faultrouter.breaker.instance header
	value  string
}

// breakerRecords reads e's breakers topic from its start to its last
// stable offset and returns the latest record of every key.
func (e *env) breakerRecords() map[string]breakerRecord {
	e.t.Helper()
	return readBreakerRecords(e.t, e.prefix+"faultrouter.breakers")
}

func readBreakerRecords(t *testing.T, topic string) map[string]breakerRecord {
	t.Helper()
	out := map[string]breakerRecord{}
	for _, r := range breakerLog(t, topic) {
		out[string(r.Key)] = breakerRecord{offset: r.Offset, live: r.Value != nil, value: string(r.Value),
			writer: codec.ParseBreakerHeaders(r.Headers).Instance}
	}
	return out
}

// breakerLog reads every record of the breakers topic from its log start to
// its last stable offset: what the cleaner has left of it.
func breakerLog(t *testing.T, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seeds := []kgo.Opt{kgo.SeedBrokers(strings.Split(brokers, ",")...)}
	cl, err := kgo.NewClient(seeds...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ranges, err := scan.Committed(ctx, kadm.NewClient(cl), topic)
	if err != nil {
		t.Fatal(err)
	}
	var out []*kgo.Record
	if err := scan.Read(ctx, seeds, ranges, func(b *scan.Batch) error {
		out = append(out, b.Records...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// allPublishedOnce waits until a retry of every task is published, then
// requires each exactly once.
func (e *env) allPublishedOnce(tasks []string, when string, logs func() string) {
	e.t.Helper()
	if !waitFor(60*time.Second, func() bool { return len(e.retriesPublished(0)) == len(tasks) }) {
		e.t.Fatalf("%s, %d of %d retries were published\n%s", when, len(e.retriesPublished(0)), len(tasks), logs())
	}
	for id, n := range e.retriesPublished(2 * time.Second) {
		if n != 1 {
			e.t.Errorf("task %s: %d retries, want 1", id, n)
		}
	}
}

// retriesPublished counts the retries published so far, by task.
func (e *env) retriesPublished(settle time.Duration) map[string]int {
	got := map[string]int{}
	for _, r := range e.tail("retry", settle) {
		got[str(r, "task_id")]++
	}
	return got
}
