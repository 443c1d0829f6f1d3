package integration

import (
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

// retriesPublished counts the retries published so far, by task.
func (e *env) retriesPublished(settle time.Duration) map[string]int {
	got := map[string]int{}
	for _, r := range e.tail("retry", settle) {
		got[str(r, "task_id")]++
	}
	return got
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
	if !waitFor(60*time.Second, func() bool { return len(e.retriesPublished(0)) == len(tasks) }) {
		t.Fatalf("after the newer item was decided, %d of %d retries were published\n%s", len(e.retriesPublished(0)), len(tasks), logs())
	}
	for id, n := range e.retriesPublished(2 * time.Second) {
		if n != 1 {
			t.Errorf("task %s: %d retries, want 1", id, n)
		}
	}
}
