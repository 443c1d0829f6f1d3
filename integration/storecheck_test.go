package integration

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/checker"
)

// checkStores compares the Pebble store of every stopped router instance
// (dirs: instance -> --state-dir) with the state changelog of e, read from
// its start with read_committed (checker.CheckStore): each partition must
// hold exactly what the changelog says below its checkpoint, and a
// partition released at the changelog's end exactly what a restore from the
// start builds. Every mismatch fails the test, naming the instance,
// partition and task. It returns the number of tasks compared.
func checkStores(ctx context.Context, t *testing.T, e *env, dirs map[string]string) int {
	t.Helper()
	topic := e.prefix + "faultrouter.state"
	log := readChangelog(ctx, t, topic)
	compared := 0
	for _, name := range slices.Sorted(maps.Keys(dirs)) {
		rep, err := checker.CheckStore(name, dirs[name], log)
		if err != nil {
			t.Fatalf("store of %s: %v", name, err)
		}
		t.Logf("store vs changelog: %s", rep.Summary())
		for _, p := range rep.Partitions {
			compared += p.Compared
		}
		const shown = 20
		for i, m := range rep.Mismatches {
			if i == shown {
				t.Errorf("... and %d more mismatches of the store of %s", len(rep.Mismatches)-shown, name)
				break
			}
			t.Errorf("the store differs from the changelog %s: %s", topic, m)
		}
	}
	return compared
}

// readChangelog reads the state changelog from its start to its committed
// end (no router runs: no transaction is open).
func readChangelog(ctx context.Context, t *testing.T, topic string) checker.Changelog {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	before, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = before.Error()
	}
	if err != nil {
		t.Fatalf("committed ends of %s: %v", topic, err)
	}
	log := checker.Changelog{Records: readTopic(ctx, t, topic, true), Ends: map[int32]int64{}}
	after, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = after.Error()
	}
	if err != nil {
		t.Fatalf("committed ends of %s: %v", topic, err)
	}
	for _, o := range sortedOffsets(after) {
		if b, ok := before.Lookup(topic, o.Partition); !ok || b.Offset != o.Offset {
			t.Fatalf("the changelog %s/%d moved while it was read (committed end %d, then %d): is a router still running?", topic, o.Partition, b.Offset, o.Offset)
		}
		log.Ends[o.Partition] = o.Offset
	}
	return log
}

// running reports whether the router's process has not exited (a schedule
// may have killed it without starting another).
func (r *router) running() bool {
	select {
	case err := <-r.done:
		r.done <- err
		return false
	default:
		return true
	}
}
