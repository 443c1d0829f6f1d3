package integration

import (
	"strings"
	"testing"
	"time"
)

// Guards the manual reset: a prompt template breaker latched open by a
// MODEL_HALLUCINATION stays open until a person closes it, and `faultrouter
// breaker reset` does: the command reaches the router on every decisions
// partition, the OPEN->CLOSED transition naming the operator appears on the
// alerts topic, and each command record gets its audit record.
func TestBreakerResetCommand(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	halluc := strings.Replace(taskEvent("h-1", "t-halluc", 1,
		`"status":"OK","stage":"MODEL","output":{"text":"Shipped on 2026-02-30.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`),
		`"prompt_template":"support-v3"`, `"prompt_template":"ship-v2"`, 1)
	e.cli(halluc, "produce", "--topic", "ingress")
	opened := func(a []map[string]any) bool {
		for _, x := range a {
			if str(x, "key") == "ship-v2" && str(x, "to") == "OPEN" {
				return true
			}
		}
		return false
	}
	if a := e.tailUntil("alerts", 30*time.Second, opened); !opened(a) {
		t.Fatalf("the hallucination did not open the ship-v2 breaker: %v\nlogs:\n%s", a, r.logs.String())
	}

	out := e.cli("", "breaker", "reset", "--scope", "PROMPT_TEMPLATE", "--key", "ship-v2", "--reason", "prompt fixed", "--operator", "ops-lee")
	if !strings.Contains(out, "3 partitions") {
		t.Errorf("breaker reset printed %q, want it written to the 3 decisions partitions", out)
	}
	closed := func(a []map[string]any) []map[string]any {
		var c []map[string]any
		for _, x := range a {
			if str(x, "key") == "ship-v2" && str(x, "to") == "CLOSED" {
				c = append(c, x)
			}
		}
		return c
	}
	alerts := e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(closed(a)) >= 1 })
	c := closed(alerts)
	if len(c) != 1 || str(c[0], "from") != "OPEN" || !strings.Contains(str(c[0], "reason"), "ops-lee") {
		t.Fatalf("want exactly one OPEN->CLOSED for ship-v2 naming the operator, got %v", c)
	}
	resets := func(a []map[string]any) int {
		n := 0
		for _, x := range a {
			if str(x, "decision.rule") == "breaker.reset" && str(x, "decision.route") == "COMPLETE" {
				n++
			}
		}
		return n
	}
	audit := e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return resets(a) >= 3 })
	if n := resets(audit); n != 3 {
		t.Errorf("audit: %d breaker.reset records, want one per decisions partition (3)", n)
	}
	if got, _ := scrape(t, r.metrics, `faultrouter_breakers{scope="PROMPT_TEMPLATE",state="OPEN"}`); got != 0 {
		t.Errorf("open template breakers after the reset = %v, want 0", got)
	}
}
