package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Guards "a latch reaches instances that were not there when it was set": a
// hallucination latches its prompt template's breaker on instance a while a
// runs alone. Instance b joins the group afterwards and must hold the due
// retries it decides for that template; then both stop and instance c
// starts with an empty state directory and must hold them too. The latch
// reaches b and c through the hallucination's latch item on the compacted
// breakers topic, which every instance reads whole before it reports ready. `breaker reset` then releases every
// held retry, each exactly once.
func TestBreakerLatchReachesLaterInstances(t *testing.T) {
	e := newEnv(t)
	ra := e.startRouter("a", t.TempDir())
	const tpl = "late-v1"
	withTpl := func(line string) string {
		return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
	}
	e.cli(withTpl(taskEvent("h-1", "ll-halluc", 1,
		`"status":"OK","stage":"MODEL","output":{"text":"Refund per policy 99.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`)),
		"produce", "--topic", "ingress")
	// a routed it: its latch item is on the breakers topic
	if a := e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return len(byTask(a, "ll-halluc")) == 1 }); len(byTask(a, "ll-halluc")) != 1 {
		t.Fatalf("instance a did not route ll-halluc: %v\n%s", a, ra.logs.String())
	}
	if it := e.breakerRecords()["item/PROMPT_TEMPLATE/ll-halluc/"+tpl]; !it.live || it.writer != "a" {
		t.Fatalf("ll-halluc's latch item on the breakers topic: %+v, want open, written by a", it)
	}

	rb := e.startRouter("b", t.TempDir())
	logs := func() string { return "router a:\n" + ra.logs.String() + "\nrouter b:\n" + rb.logs.String() }
	first := e.decideTimeouts(withTpl, "lb", logs)
	time.Sleep(3 * time.Second) // the retries were due 1 s after the timeouts
	if retries := e.tail("retry", time.Second); len(retries) != 0 {
		t.Fatalf("%d retries published into the latched %s breaker by a or b, want 0: %v\n%s", len(retries), tpl, retries, logs())
	}

	ra.stop(t)
	rb.stop(t)
	rc := e.startRouter("c", t.TempDir()) // empty state directory; a is gone
	logs = func() string { return "router c:\n" + rc.logs.String() }
	second := e.decideTimeouts(withTpl, "lc", logs)
	time.Sleep(3 * time.Second)
	if retries := e.tail("retry", time.Second); len(retries) != 0 {
		t.Fatalf("%d retries published into the latched %s breaker by c, started after a was gone, want 0: %v\n%s", len(retries), tpl, retries, logs())
	}

	e.cli("", "breaker", "reset", "--scope", "PROMPT_TEMPLATE", "--key", tpl, "--reason", "prompt fixed", "--operator", "ops-lee")
	tasks := append(first, second...)
	retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(r) >= len(tasks) })
	time.Sleep(2 * time.Second)
	retries = e.tailNow("retry")
	for _, id := range tasks {
		if n := len(byTask(retries, id)); n != 1 {
			t.Errorf("task %s: %d retries after the reset, want 1\n%s", id, n, logs())
		}
	}
	if len(retries) != len(tasks) {
		t.Errorf("%d retries after the reset, want %d", len(retries), len(tasks))
	}
}

// decideTimeouts produces a timeout for six new tasks of the template that
// withTpl sets, one task on each partition at least, waits until each is
// decided RETRY and returns the task IDs.
func (e *env) decideTimeouts(withTpl func(string) string, prefix string, logs func() string) []string {
	e.t.Helper()
	var in strings.Builder
	var tasks []string
	for i := range 6 {
		id := fmt.Sprintf("%s-%d", prefix, i)
		tasks = append(tasks, id)
		in.WriteString(withTpl(taskEvent(fmt.Sprintf("%s-to-%d", prefix, i), id, 1, timeoutFields)))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")
	audit := e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool {
		n := 0
		for _, id := range tasks {
			n += len(byTask(a, id))
		}
		return n == len(tasks)
	})
	parts := map[float64]bool{}
	for _, id := range tasks {
		recs := byTask(audit, id)
		if len(recs) != 1 || str(recs[0], "decision.route") != "RETRY" {
			e.t.Fatalf("task %s: audit %v, want one RETRY decision\n%s", id, recs, logs())
		}
		p, _ := get(recs[0], "input.partition").(float64)
		parts[p] = true
	}
	if len(parts) != 3 {
		e.t.Fatalf("the timeouts landed on partitions %v, want all 3 (so on every instance)", parts)
	}
	return tasks
}
