package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Guards the exactly-once contract on a three-broker cluster as the
// checker sees it: TestChecker's workload, longer (about 100,000 tasks over
// 150 s), on topics at replication 3 and min.insync.replicas 2, while
// router instances are killed, scaled 1 -> 3 -> 1 and paused past their
// session timeout, and among those faults one broker at a time is
// SIGKILLed three times (the one that leads most of the test's partitions,
// started again once its leaders moved, back in every ISR before the next
// fault). Every output must be what the model computes from the committed
// input log. It runs as `make soak-cluster` (several minutes: not in CI,
// where TestClusterChaos runs instead) on kafka.sh's cluster.
func TestCheckerCluster(t *testing.T) {
	clusterBrokers(t)
	seed := checkerSeed(t)
	res := runChecker(t, checkerConfig{seed: seed, tasks: 100_000, duration: 150 * time.Second, compressed: true, unwritable: true,
		set: openCooldown, routerArgs: []string{"--replication-factor", "3"}, schedule: clusterFaults})
	printSummary(os.Stdout, []checkerResult{res})
	if bad := unexpected(t, res.rep); len(bad) > 0 {
		t.Fatalf("the router's outputs differ from the model: %v (seed %d; JSON report %s)", bad, seed, res.jsonPath)
	}
	if n := strings.Count(strings.Join(res.faults, ","), "broker-kill"); n != 3 {
		t.Fatalf("%d broker kills, want 3: %v", n, res.faults)
	}
	t.Logf("latches: %s; OPEN states: %s", res.rep.Latch, res.rep.Open)
	requireCleaned(t, res)
	if res.storeTasks == 0 {
		t.Errorf("no task state of the instances' stores was compared with the changelog (seed %d)", seed)
	}
}

// clusterFaults is TestCheckerCluster's schedule: the router faults of
// TestChecker with three broker kills among them, each logged with what
// the routers logged meanwhile.
func clusterFaults(c *cluster, began time.Time, produced *atomic.Int64) []string {
	t := c.t
	s := &schedule{t: t, began: began, produced: produced}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	last, kills := int32(-1), 0
	brokerKill := func() {
		kills++
		from := time.Now()
		k := killBroker(ctx, t, c.e, kills, last, produced, c.routers)
		last = int32(k.node)
		// the group may rebalance when its coordinator dies
		c.rebalances = append(c.rebalances, from, time.Now())
	}
	s.at(3*time.Second, "kill", func() {
		c.routers["a"].kill()
		c.start("a")
	})
	s.at(8*time.Second, "scale-up", func() {
		c.start("b")
		c.start("c")
	})
	s.at(15*time.Second, "broker-kill", brokerKill)
	s.at(60*time.Second, "pause", func() {
		sessionTimeout := 10 * time.Second // the router's default
		from, b := time.Now(), c.routers["b"]
		syscall.Kill(-b.cmd.Process.Pid, syscall.SIGSTOP)
		time.Sleep(sessionTimeout + 6*time.Second)
		syscall.Kill(-b.cmd.Process.Pid, syscall.SIGCONT)
		c.rebalances = append(c.rebalances, from.Add(sessionTimeout), time.Now())
	})
	s.at(80*time.Second, "broker-kill", brokerKill)
	s.at(120*time.Second, "scale-down", func() {
		c.rebalances = append(c.rebalances, time.Now())
		for _, name := range []string{"b", "c"} {
			c.routers[name].stop(t)
			delete(c.routers, name)
		}
	})
	s.at(125*time.Second, "broker-kill", brokerKill)
	if kills != 3 {
		t.Fatalf("%d broker kills, want 3", kills)
	}
	t.Logf("faults: %s", fmt.Sprint(s.done))
	return s.done
}
