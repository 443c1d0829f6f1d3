package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Guards the restore contract: a router started on an EMPTY state
// directory restores a task's history from the state changelog and routes the
// task's next event as if it had never stopped: the third timeout of a task is
// still dead-lettered (network_timeout.exhausted), and a redelivery of its first
// event is still dropped. Once both routers stopped, each one's Pebble store
// holds exactly what the changelog says (checkStores): the restored store
// too, not only the decisions routed on it.
func TestRestoreFromChangelogOnEmptyStateDir(t *testing.T) {
	e := newEnv(t)
	dirs := map[string]string{"first": t.TempDir(), "restored": t.TempDir()}
	r := e.startRouter("a", dirs["first"])

	// two timeouts, each retried when due, as a worker would drive them
	for n := 1; n <= 2; n++ {
		e.cli(taskEvent(fmt.Sprintf("x-%d", n), "t-x", n, timeoutFields), "produce", "--topic", "ingress")
		retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-x")) >= n })
		if got := len(byTask(retries, "t-x")); got != n {
			t.Fatalf("after timeout %d: %d retry records, want %d", n, got, n)
		}
	}
	r.stop(t)

	// a new router, same instance ID, nothing on disk
	r = e.startRouter("a", dirs["restored"])
	// the line is written by the router's log goroutine, shortly after ready
	if !waitFor(10*time.Second, func() bool { return strings.Contains(r.logs.String(), "state restored") }) {
		t.Errorf("the new router did not log a restore from the changelog; logs:\n%s", r.logs.String())
	}
	e.cli(taskEvent("x-3", "t-x", 3, timeoutFields)+taskEvent("x-1", "t-x", 1, timeoutFields), "produce", "--topic", "ingress")

	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-x")) >= 4 })
	got := byTask(audit, "t-x")
	wantRoutes := []string{"RETRY", "RETRY", "DEADLETTER", "DROP"}
	if len(got) != len(wantRoutes) {
		t.Fatalf("t-x: %d audit records, want %d: %v", len(got), len(wantRoutes), got)
	}
	for i, w := range wantRoutes {
		if route := str(got[i], "decision.route"); route != w {
			t.Errorf("t-x audit %d (%s): route %s, want %s (rule %s, reason %q)", i, str(got[i], "event_id"), route, w,
				str(got[i], "decision.rule"), str(got[i], "decision.reason"))
		}
	}
	if rule := str(got[2], "decision.rule"); rule != "network_timeout.exhausted" {
		t.Errorf("third timeout: rule %q, want network_timeout.exhausted", rule)
	}
	if n, _ := get(got[2], "decision.totals.attempts").(float64); n != 3 {
		t.Errorf("third timeout: totals.attempts %v, want 3 (the restored history plus this one)", n)
	}
	dl := byTask(e.tail("deadletter", 2*time.Second), "t-x")
	if len(dl) != 1 || str(dl[0], "event_id") != "x-3" {
		t.Errorf("deadletter: want exactly the third timeout of t-x, got %v", dl)
	}
	if retries := byTask(e.tail("retry", 2*time.Second), "t-x"); len(retries) != 2 {
		t.Errorf("retry: %d records for t-x after the restart, want still 2", len(retries))
	}
	r.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n := checkStores(ctx, t, e, dirs); n == 0 {
		t.Errorf("no task state of the stores was compared with the changelog")
	}
}

// chaos runs one chaos scenario: the stream is produced while disrupt runs,
// then the router drains everything and the topics are verified.
func chaos(t *testing.T, e *env, s stream, disrupt func(produced *atomic.Int64)) (report, time.Duration) {
	t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var produced atomic.Int64
	done := make(chan error, 1)
	go func() { done <- s.produce(ctx, t, e.prefix+"ai.tasks.ingress", &produced) }()
	disrupt(&produced)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("produced %d records in %s", produced.Load(), time.Since(began).Round(time.Millisecond))

	if !waitFor(3*time.Minute, func() bool { return consumedAll(ctx, e, e.prefix+"ai.tasks.ingress") }) {
		t.Fatalf("the router did not consume every ingress record within 3 min")
	}
	var retries int
	for i := 0; i < s.tasks; i++ {
		if k := kind(i % int(nKinds)); want[k].route == "RETRY" {
			retries++
		}
	}
	waitFor(60*time.Second, func() bool { return len(readTopic(ctx, t, e.prefix+"ai.tasks.retry", true)) >= retries })
	rep := verify(ctx, t, e, s)
	if rep.retries != retries {
		t.Errorf("retry topic holds %d records, want %d (one per retrying task)", rep.retries, retries)
	}
	return rep, time.Since(began)
}

func logReport(t *testing.T, rep report, tx txCounts, took time.Duration) {
	t.Helper()
	t.Logf("verified in %s: %d inputs, %d audit (%d DROP), %d review, %d deadletter, %d retries",
		took.Round(time.Millisecond), rep.inputs, rep.audit, rep.dropped, rep.review, rep.deadletter, rep.retries)
	t.Logf("transactions (scraped from /metrics just before each kill/stop and at the end; a killed router's last ones are lost): committed %.0f, aborted %.0f",
		tx.committed, tx.aborted)
	t.Logf("transaction markers on the state topic, which every transaction writes (one per partition it touched): %d commit, %d abort",
		rep.stateMarkers.commits, rep.stateMarkers.aborts)
	t.Logf("records of aborted transactions (read_uncommitted minus read_committed over audit, review, deadletter, retry, state): %d; none of them visible with read_committed",
		rep.abortedRecords)
}

// quietBreakers is a policy file whose breakers never trip: the chaos
// workload is mostly failures of one provider/model and template, and the
// chaos tests guard exactly-once delivery, not the breakers (breaker_test.go
// does), so a held retry would only blur them.
func quietBreakers(t *testing.T) []string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "policy.yaml")
	err := os.WriteFile(f, []byte("breakers:\n"+
		"  provider_model: {min_requests: 1000000000}\n"+
		"  downstream: {min_requests: 1000000000}\n"+
		"  prompt_template: {min_requests: 1000000000}\n"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--policy", f}
}

// pause waits d give or take half, to land disruptions at random moments.
func pause(d time.Duration) { time.Sleep(d/2 + rand.N(d)) }

// Guards exactly once under load: with >= 50,000 events of mixed classes and 10% exact
// redeliveries, a router SIGKILLed at random moments (4 times, the last
// restart on an empty state directory that must be restored from the
// changelog) routes every input exactly once: one audit record per input, one
// routed record per outcome, one retry per due retry, per-task order kept,
// nothing of an aborted transaction visible with read_committed.
func TestChaosKill(t *testing.T) {
	e := newEnv(t)
	s := stream{run: "kill", tasks: 45_000, redeliveries: 5_000, poison: 50, rate: 1000} // ~50 s: every kill lands mid-stream
	var tx txCounts
	dir, pol := t.TempDir(), quietBreakers(t)
	r := e.startRouter("a", dir, pol...)
	rep, took := chaos(t, e, s, func(produced *atomic.Int64) {
		for k := 1; k <= 4; k++ {
			pause(4 * time.Second)
			tx.scrape(r)
			at := produced.Load()
			r.kill()
			if k == 4 {
				dir = t.TempDir() // nothing on disk: restore everything from the changelog
			}
			restart := time.Now()
			r = e.startRouter("a", dir, pol...)
			t.Logf("kill %d at %d produced records; ready again after %s (empty state dir: %v)",
				k, at, time.Since(restart).Round(time.Millisecond), k == 4)
		}
	})
	tx.scrape(r)
	logReport(t, rep, tx, took)
}

// Guards exactly once while scaling: two router instances of one group, scaled 1 -> 2 -> 1
// during the stream, route every input exactly once (partitions move with
// their state and their pending retries).
func TestChaosScale(t *testing.T) {
	e := newEnv(t)
	s := stream{run: "scale", tasks: 27_000, redeliveries: 3_000, poison: 20, rate: 2500}
	var tx txCounts
	pol := quietBreakers(t)
	a := e.startRouter("a", t.TempDir(), pol...)
	var b *router
	rep, took := chaos(t, e, s, func(*atomic.Int64) {
		pause(3 * time.Second)
		began := time.Now()
		b = e.startRouter("b", t.TempDir(), pol...)
		t.Logf("scaled to 2: b ready after %s", time.Since(began).Round(time.Millisecond))
		pause(4 * time.Second)
		tx.scrape(a)
		began = time.Now()
		a.stop(t)
		t.Logf("scaled to 1: a stopped in %s", time.Since(began).Round(time.Millisecond))
	})
	tx.scrape(b)
	logReport(t, rep, tx, took)
}

// Guards exactly once across a broker restart: the broker stopped and restarted mid-stream; the
// router recovers by itself and routes every input exactly once. It restarts
// the broker of FAULTROUTER_KAFKA_DIR / FAULTROUTER_KAFKA_PORT with
// integration/kafka.sh, as integration/test.sh exports them.
func TestChaosBrokerRestart(t *testing.T) {
	if os.Getenv("FAULTROUTER_KAFKA_DIR") == "" {
		t.Skip("FAULTROUTER_KAFKA_DIR is unset: this test restarts the broker, so it only runs on one that integration/test.sh started")
	}
	if out, err := exec.Command("../integration/kafka.sh", "brokers").Output(); err != nil || strings.TrimSpace(string(out)) != brokers {
		t.Fatalf("kafka.sh would restart %q, but the tests run against %q (set FAULTROUTER_KAFKA_PORT)", strings.TrimSpace(string(out)), brokers)
	}
	e := newEnv(t)
	s := stream{run: "broker", tasks: 27_000, redeliveries: 3_000, poison: 20, rate: 2500}
	r := e.startRouter("a", t.TempDir(), quietBreakers(t)...)
	rep, took := chaos(t, e, s, func(produced *atomic.Int64) {
		pause(4 * time.Second)
		began, at := time.Now(), produced.Load()
		cmd := exec.Command("../integration/kafka.sh", "restart")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("kafka.sh restart: %v", err)
		}
		t.Logf("broker restarted at %d produced records in %s", at, time.Since(began).Round(time.Millisecond))
	})
	var end txCounts
	end.scrape(r)
	if r.cmd.ProcessState != nil {
		t.Fatalf("the router exited during the broker restart; logs:\n%s", r.logs.String())
	}
	logReport(t, rep, end, took)
}

// Guards a cheap rebalance: when a second instance joins a group under load,
// the first keeps the local state of the partitions it keeps and restores
// only what its own batch in flight at the revoke committed after it (an
// eager rebalance revokes every partition, and a transaction is almost
// always in flight under load), not those partitions from the changelog's
// start; and every input is still routed exactly once. b restores the
// partition that moved to it.
func TestJoinUnderLoadRestoresOnlyWhatMoved(t *testing.T) {
	e := newEnv(t)
	s := stream{run: "join", tasks: 30_000, rate: 2500}
	pol := quietBreakers(t)
	a := e.startRouter("a", t.TempDir(), pol...)
	var before float64
	var b *router
	rep, took := chaos(t, e, s, func(produced *atomic.Int64) {
		time.Sleep(7 * time.Second) // about 17,000 task states on the changelog, all of a's
		before = restoredRecords(t, a)
		at := produced.Load()
		began := time.Now()
		b = e.startRouter("b", t.TempDir(), pol...)
		t.Logf("b joined at %d produced records, ready after %s", at, time.Since(began).Round(time.Millisecond))
	})
	logReport(t, rep, txCounts{}, took)
	restoredA, restoredB := restoredRecords(t, a)-before, restoredRecords(t, b)
	t.Logf("records restored after b joined: a %.0f, b %.0f", restoredA, restoredB)
	if restoredA > 1500 {
		t.Errorf("a restored %.0f records when b joined, want at most a batch's worth for the partitions it kept (it restored them from the changelog's start); logs of a:\n%s",
			restoredA, tailLines(a.logs.String(), 40))
	}
	if strings.Contains(a.logs.String(), "local state of the partition dropped") {
		t.Errorf("a dropped the local state of a partition it kept; logs of a:\n%s", tailLines(a.logs.String(), 40))
	}
	if restoredB == 0 {
		t.Errorf("b restored nothing: it was assigned no partition with state")
	}
}

// restoredRecords is a router's faultrouter_restore_records_total.
func restoredRecords(t *testing.T, r *router) float64 {
	t.Helper()
	v, ok := scrape(t, r.metrics, "faultrouter_restore_records_total")
	if !ok {
		t.Fatalf("no faultrouter_restore_records_total in the metrics")
	}
	return v
}
