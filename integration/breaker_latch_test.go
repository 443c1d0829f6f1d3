package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Guards "a hallucination's latch reaches every instance": with two router
// instances sharing the partitions, the one that routes a MODEL_HALLUCINATION
// latches its prompt template's breaker open and writes the latch item of
// its task on the breakers topic in the same transaction; the other instance
// reads it (its own CLOSED->OPEN transition on the alerts topic), so the
// due retries of that template are held on both instances, not only on the
// one that saw the hallucination. `breaker reset` then writes its RESET
// record after the item, which closes the template on both, and every held
// retry is published; every instance audits the reset's command. Real
// default policy, breakers on.
func TestBreakerLatchReachesEveryInstance(t *testing.T) {
	e := newEnv(t)
	ra := e.startRouter("a", t.TempDir())
	rb := e.startRouter("b", t.TempDir())
	logs := func() string { return "router a:\n" + ra.logs.String() + "\nrouter b:\n" + rb.logs.String() }

	const tpl = "latch-v1"
	withTpl := func(line string) string {
		return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
	}
	e.cli(withTpl(taskEvent("h-1", "lt-halluc", 1,
		`"status":"OK","stage":"MODEL","output":{"text":"Refund per policy 99.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`)),
		"produce", "--topic", "ingress")

	openedBy := func(a []map[string]any, to string) map[string]bool {
		by := map[string]bool{}
		for _, x := range a {
			if str(x, "scope") == "PROMPT_TEMPLATE" && str(x, "key") == tpl && str(x, "kind") == "TRANSITION" && str(x, "to") == to {
				by[str(x, "instance")] = true
			}
		}
		return by
	}
	alerts := e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(openedBy(a, "OPEN")) == 2 })
	if by := openedBy(alerts, "OPEN"); !by["a"] || !by["b"] {
		t.Fatalf("the %s breaker opened on instances %v, want a and b: %v\n%s", tpl, by, alerts, logs())
	}

	// timeouts of tasks on every partition (so on both instances): each is
	// decided RETRY, and the retry is held while the template is latched
	var in strings.Builder
	tasks := []string{"lt-1", "lt-2", "lt-3", "lt-4", "lt-5", "lt-6"}
	for i, id := range tasks {
		in.WriteString(withTpl(taskEvent(fmt.Sprintf("to-%d", i), id, 1, timeoutFields)))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")
	audit := e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool {
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
			t.Fatalf("task %s: audit %v, want one RETRY decision", id, recs)
		}
		p, _ := get(recs[0], "input.partition").(float64)
		parts[p] = true
	}
	if len(parts) != 3 {
		t.Fatalf("the timeouts landed on partitions %v, want all 3 (so on both instances)", parts)
	}
	// the retries were due 1 s after the timeouts
	time.Sleep(3 * time.Second)
	if retries := e.tail("retry", time.Second); len(retries) != 0 {
		t.Fatalf("%d retries published into the latched %s breaker, want 0: %v\n%s", len(retries), tpl, retries, logs())
	}

	e.cli("", "breaker", "reset", "--scope", "PROMPT_TEMPLATE", "--key", tpl, "--reason", "prompt fixed", "--operator", "ops-lee")
	alerts = e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(openedBy(a, "CLOSED")) == 2 })
	if by := openedBy(alerts, "CLOSED"); !by["a"] || !by["b"] {
		t.Fatalf("the reset closed %s on instances %v, want a and b", tpl, by)
	}
	retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(r) >= len(tasks) })
	for _, id := range tasks {
		if n := len(byTask(retries, id)); n != 1 {
			t.Errorf("task %s: %d retries after the reset, want 1", id, n)
		}
	}
	resets := 0
	for _, x := range e.tailNow("audit") {
		if str(x, "decision.rule") == "breaker.reset" {
			resets++
		}
	}
	if resets != 3 {
		t.Errorf("%d breaker.reset audit records, want one per decisions partition (3)", resets)
	}
	recs := e.breakerRecords()
	item, reset := recs["item/PROMPT_TEMPLATE/lt-halluc/"+tpl], recs["reset/PROMPT_TEMPLATE/"+tpl]
	switch {
	case item.offset == 0 && !item.live && item.writer == "":
		t.Errorf("no latch item of lt-halluc on the breakers topic: %v", recs)
	case item.writer != "a" && item.writer != "b":
		t.Errorf("lt-halluc's latch item was written by %q, want the instance that routed it", item.writer)
	case item.live && (!reset.live || reset.offset < item.offset):
		t.Errorf("the RESET (offset %d, live %v) does not follow lt-halluc's open item (offset %d)", reset.offset, reset.live, item.offset)
	}
}
