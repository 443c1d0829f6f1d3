package integration

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// partitionCount is the partition count of a topic.
func partitionCount(ctx context.Context, t *testing.T, topic string) int {
	t.Helper()
	td, err := kadm.NewClient(kafkaClient(t)).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := td[topic]
	if !ok || d.Err != nil {
		t.Fatalf("topic %s: %v", topic, d.Err)
	}
	return len(d.Partitions)
}

// Guards partition changes without split tasks: with three router instances
// routing a seeded workload of every class, partitions are added to ingress
// (3 -> 6), then to decisions, then to state, one topic at a time, while the
// stream runs. Between the steps the counts differ, and the group's
// assignment must keep partition p of ingress and of decisions on one
// instance (under the range assignor the instance that routes a task's
// events and the one that routes its review decisions would differ, each
// with its own store, and both would write its partition's changelog).
// Records written to the new partitions are forwarded to their task's
// partition. The reference-model checker then finds every output of the
// committed inputs exactly once: nothing lost, nothing duplicated, every
// review decided against the task's own state.
func TestPartitionsAddedOneTopicAtATimeUnderLoad(t *testing.T) {
	seed := checkerSeed(t)
	grow := func(c *cluster, began time.Time, produced *atomic.Int64) []string {
		st := &schedule{t: t, began: began, produced: produced}
		adm := kadm.NewClient(kafkaClient(t))
		at := st.at
		add := func(short string) func() {
			return func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if _, err := adm.CreatePartitions(ctx, 3, c.e.prefix+short); err != nil {
					t.Fatal(err)
				}
			}
		}
		at(2*time.Second, "three-instances", func() { c.start("b"); c.start("c") })
		at(7*time.Second, "ingress+3", add("ai.tasks.ingress"))
		at(13*time.Second, "decisions+3", add("ai.tasks.review.decisions"))
		at(19*time.Second, "state+3", add("faultrouter.state"))
		return st.done
	}
	res := runChecker(t, checkerConfig{seed: seed, tasks: 12_000, duration: 25 * time.Second, schedule: grow,
		routerArgs: []string{"--partition-check", "1s"}, partitionsChange: true})
	printSummary(os.Stdout, []checkerResult{res})
	if bad := unexpected(t, res.rep); len(bad) > 0 {
		t.Fatalf("with partitions added under load the router's outputs differ from the model: %v (seed %d; JSON report %s)", bad, seed, res.jsonPath)
	}
	if res.rep.Inputs == 0 {
		t.Fatal("no inputs were checked")
	}
}
