package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Guards the latch rule of hallucinations on the real broker: two
// hallucinations latch one prompt template; a reviewer's decision of the
// first item keeps it latched on every instance (no CLOSED transition, the
// due retries of the template stay held), also on an instance that starts
// with an empty state directory after the instance that saw the
// hallucinations is gone; the decision of the second item reopens it
// everywhere and the held retries are published, once each.
func TestTemplateStaysLatchedUntilEveryHallucinationItemIsDecided(t *testing.T) {
	e := newEnv(t)
	ra := e.startRouter("a", t.TempDir())
	rb := e.startRouter("b", t.TempDir())
	var rc *router
	logs := func() string {
		s := "router a:\n" + ra.logs.String() + "\nrouter b:\n" + rb.logs.String()
		if rc != nil {
			s += "\nrouter c:\n" + rc.logs.String()
		}
		return s
	}

	const tpl = "items-v1"
	withTpl := func(line string) string {
		return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
	}
	halluc := `"status":"OK","stage":"MODEL","output":{"text":"Refund per policy 99.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`
	e.cli(withTpl(taskEvent("h-1", "it-halluc-1", 1, halluc))+withTpl(taskEvent("h-2", "it-halluc-2", 1, halluc)), "produce", "--topic", "ingress")

	transitions := func(a []map[string]any, to string) map[string]int {
		by := map[string]int{}
		for _, x := range a {
			if str(x, "scope") == "PROMPT_TEMPLATE" && str(x, "key") == tpl && str(x, "kind") == "TRANSITION" && str(x, "to") == to {
				by[str(x, "instance")]++
			}
		}
		return by
	}
	alerts := e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(transitions(a, "OPEN")) == 2 })
	if by := transitions(alerts, "OPEN"); by["a"] != 1 || by["b"] != 1 {
		t.Fatalf("the %s breaker opened on instances %v, want once on a and b\n%s", tpl, by, logs())
	}

	var in strings.Builder
	tasks := []string{"it-1", "it-2", "it-3", "it-4", "it-5", "it-6"}
	for i, id := range tasks {
		in.WriteString(withTpl(taskEvent(fmt.Sprintf("to-%d", i), id, 1, timeoutFields)))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")
	decided := func(id, rule string) {
		t.Helper()
		e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool {
			for _, x := range byTask(a, id) {
				if str(x, "decision.rule") == rule {
					return true
				}
			}
			return false
		})
	}
	for _, id := range tasks {
		decided(id, "network_timeout.retry")
	}
	held := func(when string) {
		t.Helper()
		time.Sleep(3 * time.Second) // the retries were due 1 s after the timeouts
		if retries := e.tail("retry", time.Second); len(retries) != 0 {
			t.Fatalf("%s: %d retries published into the latched %s breaker, want 0: %v\n%s", when, len(retries), tpl, retries, logs())
		}
		if by := transitions(e.tailNow("alerts"), "CLOSED"); len(by) != 0 {
			t.Fatalf("%s: %s closed on instances %v, want still latched\n%s", when, tpl, by, logs())
		}
	}
	held("before any decision")

	e.cli("", "review", "decide", "--task", "it-halluc-1", "--reject", "--reason", "fabricated refund", "--reviewer", "ana")
	decided("it-halluc-1", "MANUAL_REJECTED")
	held("after the first of two items was decided")

	// the instance that saw both hallucinations goes; a new one starts with
	// an empty state directory: the open item reaches it from the breakers
	// topic
	ra.stop(t)
	rc = e.startRouter("c", t.TempDir())
	held("after a restart with an empty state directory")

	e.cli("", "review", "decide", "--task", "it-halluc-2", "--reject", "--reason", "fabricated refund", "--reviewer", "ana")
	alerts = e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool {
		by := transitions(a, "CLOSED")
		return by["b"] >= 1 && by["c"] >= 1
	})
	if by := transitions(alerts, "CLOSED"); by["b"] != 1 || by["c"] != 1 {
		t.Fatalf("the last decision closed %s on instances %v, want once on b and c\n%s", tpl, by, logs())
	}
	retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(r) >= len(tasks) })
	for _, id := range tasks {
		if n := len(byTask(retries, id)); n != 1 {
			t.Errorf("task %s: %d retries after the template reopened, want 1", id, n)
		}
	}
}
