package integration

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// halluc is the output of a MODEL_HALLUCINATION.
const halluc = `"status":"OK","stage":"MODEL","output":{"text":"Refund per policy 99.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`

// partitionOf is the ingress partition of a task ID (murmur2, as the CLI's
// producer and the router place it) over partitions.
func partitionOf(taskID string, partitions int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(taskID)}, partitions))
}

// taskOn returns a task ID with prefix that lands on partition p of 3.
func taskOn(prefix string, p int32) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("%s-%d", prefix, i); partitionOf(id, 3) == p {
			return id
		}
	}
}

// Guards a RESET applied late, on the real broker: instance a routes a
// hallucination that latches a template on both instances, whose due
// retries both hold; the other instance (b) is frozen (SIGSTOP); a person
// resets the template (a releases what it held), and a hallucination on a,
// after the reset, latches it again. When b goes on, it reads the RESET
// command on its decisions partitions and the RESET record and the newer
// item on the breakers topic: the template stays latched on b, nothing of
// what b held is published, until the newer item is decided; then every
// held retry is published once.
func TestALateResetKeepsTheNewerLatch(t *testing.T) {
	e := newEnv(t)
	rs := map[string]*router{"a": e.startRouter("a", t.TempDir()), "b": e.startRouter("b", t.TempDir())}
	logs := func() string { return "router a:\n" + rs["a"].logs.String() + "\nrouter b:\n" + rs["b"].logs.String() }
	const tpl = "late-reset-v1"
	withTpl := func(line string) string {
		return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
	}
	transitions := func(to string) map[string]int {
		by := map[string]int{}
		for _, x := range e.tailNow("alerts") {
			if str(x, "scope") == "PROMPT_TEMPLATE" && str(x, "key") == tpl && str(x, "kind") == "TRANSITION" && str(x, "to") == to {
				by[str(x, "instance")]++
			}
		}
		return by
	}
	e.cli(withTpl(taskEvent("h-1", "lr-halluc-1", 1, halluc)), "produce", "--topic", "ingress")
	if !waitFor(30*time.Second, func() bool { return len(transitions("OPEN")) == 2 }) {
		t.Fatalf("the template latched on %v, want a and b\n%s", transitions("OPEN"), logs())
	}
	// the instance that routed the hallucination goes on; the other is frozen
	var live, frozen string
	for _, x := range e.tailNow("alerts") {
		if str(x, "task_id") == "lr-halluc-1" && str(x, "kind") == "ALERT" {
			live = str(x, "instance")
		}
	}
	if frozen = map[string]string{"a": "b", "b": "a"}[live]; frozen == "" {
		t.Fatalf("no quarantine alert names the instance that routed lr-halluc-1\n%s", logs())
	}
	livePart := partitionOf("lr-halluc-1", 3)

	tasks := e.decideTimeouts(withTpl, "lr", logs)
	time.Sleep(3 * time.Second) // due 1 s after the timeouts
	if got := e.retriesPublished(time.Second); len(got) != 0 {
		t.Fatalf("retries published into the latched template: %v\n%s", got, logs())
	}

	pid := rs[frozen].cmd.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(-pid, syscall.SIGCONT)
		}
	}
	defer resume()
	e.cli("", "breaker", "reset", "--scope", "PROMPT_TEMPLATE", "--key", tpl, "--reason", "prompt fixed", "--operator", "ops-lee")
	// the live instance releases what it held
	waitFor(15*time.Second, func() bool { return transitions("CLOSED")[live] == 1 })
	time.Sleep(2 * time.Second)
	// a newer hallucination, on the live instance's partition
	h2 := taskOn("lr-halluc-2", livePart)
	e.cli(withTpl(taskEvent("h-2", h2, 1, halluc)), "produce", "--topic", "ingress")
	e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return len(byTask(a, h2)) == 1 })
	before := e.retriesPublished(2 * time.Second)
	heldByFrozen := len(tasks) - len(before)
	if heldByFrozen == 0 {
		t.Fatalf("the live instance published every retry (%v): none was held by the frozen one\n%s", before, logs())
	}

	resume()
	if !waitFor(30*time.Second, func() bool { return transitions("OPEN")[live] == 2 }) {
		t.Fatalf("the newer hallucination did not latch the template again on %s: %v\n%s", live, transitions("OPEN"), logs())
	}
	// the frozen instance routes again: a task on one of its partitions
	for p := range int32(3) {
		if p != livePart {
			id := taskOn("lr-after-resume", p)
			e.cli(taskEvent("ok-"+id, id, 1, okFields), "produce", "--topic", "ingress")
			e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool { return len(byTask(a, id)) == 1 })
		}
	}
	time.Sleep(3 * time.Second)
	after := e.retriesPublished(time.Second)
	if !maps.Equal(after, before) {
		t.Fatalf("retries published after the reset and a newer latch item, once %s went on: %v (before it went on: %v)\n%s",
			frozen, slices.Sorted(maps.Keys(after)), slices.Sorted(maps.Keys(before)), logs())
	}
	if n := transitions("CLOSED")[frozen]; n != 0 {
		t.Fatalf("%s closed the template %d times after a reset older than the newer item, want 0\n%s", frozen, n, logs())
	}

	e.cli("", "review", "decide", "--task", h2, "--reject", "--reason", "fabricated refund", "--reviewer", "ana")
	e.cli("", "review", "decide", "--task", "lr-halluc-1", "--reject", "--reason", "fabricated refund", "--reviewer", "ana")
	e.allPublishedOnce(tasks, "after the newer item was decided", logs)
}

// Guards a latch through compaction and restarts, on the real broker:
// three instances; a hallucination on one latches a prompt template on
// all; states of that template are written after the latch by instances
// that had not read it (HALF_OPEN, CLOSED), and the breakers topic is
// compacted under them (the test waits until the cleaner has removed the
// earlier of those states). Then every instance is restarted, one at a
// time, with an empty state directory: none publishes a retry into the
// template while its item is open. Once a reviewer decides the item, every
// held retry is published exactly once.
func TestALatchOutlivesCompactionAndRestarts(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, breakersTopic := createCompactedTopics(ctx, t, e, 3)
	cancel()
	rs := map[string]*router{}
	for _, n := range []string{"a", "b", "c"} {
		rs[n] = e.startRouter(n, t.TempDir())
	}
	logs := func() string {
		var s strings.Builder
		for _, n := range []string{"a", "b", "c"} {
			fmt.Fprintf(&s, "router %s:\n%s\n", n, rs[n].logs.String())
		}
		return s.String()
	}
	const tpl = "compacted-v1"
	withTpl := func(line string) string {
		return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
	}
	latchedOn := func() map[string]int {
		by := map[string]int{}
		for _, x := range e.tailNow("alerts") {
			if str(x, "scope") == "PROMPT_TEMPLATE" && str(x, "key") == tpl && str(x, "kind") == "TRANSITION" {
				by[str(x, "instance")+" "+str(x, "to")]++
			}
		}
		return by
	}
	e.cli(withTpl(taskEvent("h-1", "cp-halluc", 1, halluc)), "produce", "--topic", "ingress")
	if !waitFor(30*time.Second, func() bool {
		by := latchedOn()
		return by["a OPEN"] == 1 && by["b OPEN"] == 1 && by["c OPEN"] == 1
	}) {
		t.Fatalf("the template latched on %v, want a, b and c\n%s", latchedOn(), logs())
	}
	tasks := e.decideTimeouts(withTpl, "cp", logs)

	// states of the template by instances that had not read the latch, the
	// latest a CLOSED (a tombstone), then the cleaner
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.DefaultProduceTopic(breakersTopic),
		kgo.RecordPartitioner(kgo.ManualPartitioner())) // partition 0, as the routers write
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	stateKey := []byte("PROMPT_TEMPLATE/" + tpl)
	write := func(key, value []byte, writer string) {
		t.Helper()
		rec := &kgo.Record{Key: key, Value: value, Headers: []kgo.RecordHeader{{Key: "faultrouter.breaker.instance", Value: []byte(writer)}}}
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	halfOpen := fmt.Sprintf(`{"scope":"PROMPT_TEMPLATE","key":%q,"state":"HALF_OPEN","latched":false,"reason":"cooldown over","updated_at":%q,"instance":"b"}`,
		tpl, time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
	cleaned := func() bool {
		n := 0
		for _, r := range breakerLog(t, breakersTopic) {
			if string(r.Key) == string(stateKey) {
				n++
			}
		}
		return n <= 1
	}
	for range 5 {
		write(stateKey, []byte(halfOpen), "b")
		write(stateKey, nil, "c")
	}
	if !waitFor(120*time.Second, func() bool {
		time.Sleep(3500 * time.Millisecond) // past segment.ms: this write rolls the segment
		write([]byte("DOWNSTREAM/compaction-filler"), nil, "c")
		return cleaned()
	}) {
		t.Fatalf("the cleaner did not compact %s within 120 s", breakersTopic)
	}
	if it := e.breakerRecords()["item/PROMPT_TEMPLATE/cp-halluc/"+tpl]; !it.live {
		t.Fatalf("cp-halluc's latch item is not live on the compacted breakers topic: %+v", it)
	}

	held := func(when string) {
		t.Helper()
		time.Sleep(3 * time.Second)
		if got := e.retriesPublished(time.Second); len(got) != 0 {
			t.Fatalf("%s: retries published into the latched template: %v\n%s", when, got, logs())
		}
	}
	held("after the compaction")
	for _, n := range []string{"a", "b", "c"} {
		rs[n].stop(t)
		rs[n] = e.startRouter(n, t.TempDir())
		held("after " + n + " restarted with an empty state directory")
	}

	e.cli("", "review", "decide", "--task", "cp-halluc", "--reject", "--reason", "fabricated refund", "--reviewer", "ana")
	e.allPublishedOnce(tasks, "after the item was decided", logs)
}
