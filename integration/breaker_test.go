package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// acmeEvent is a taskEvent answered by provider acme, model m1.
func acmeEvent(eventID, taskID string, attempt int, extra string) string {
	return strings.Replace(taskEvent(eventID, taskID, attempt, extra),
		`"provider":"openai","model":"gpt-4o"`, `"provider":"acme","model":"m1"`, 1)
}

const rateLimitedFields = `"status":"ERROR","stage":"NETWORK","error":{"type":"RateLimitError","http_status":429,"message":"slow down","retry_after_ms":1000}`

// breakerPolicy opens acme/m1 after 3 failures and half-opens 8 s later.
const breakerPolicy = `breakers:
  provider_model: {window_ms: 60000, min_requests: 3, failure_ratio: 0.5, cooldown_ms: 8000, half_open_probes: 1}
`

func transitions(alerts []map[string]any, key, to string) []map[string]any {
	var out []map[string]any
	for _, a := range alerts {
		if str(a, "scope") == "PROVIDER_MODEL" && str(a, "key") == key && str(a, "kind") == "TRANSITION" && str(a, "to") == to {
			out = append(out, a)
		}
	}
	return out
}

// Guards the breaker contract end to end on the real broker: a burst of
// 429s from one provider/model opens its breaker and writes a BreakerEvent to
// the alerts topic; the due retries of that provider are held (no retry
// record) while it is open; when the cooldown is over it half-opens and
// releases one held retry as the probe; a later SUCCEEDED for that
// provider/model closes it and releases the rest; /metrics shows the
// transitions and the breaker states.
func TestBreakerHoldsRetriesWhileOpen(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte(breakerPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.startRouter("a", t.TempDir(), "--policy", pol)

	produced := time.Now()
	e.cli(acmeEvent("rl-1", "b-1", 1, rateLimitedFields)+acmeEvent("rl-2", "b-2", 1, rateLimitedFields)+
		acmeEvent("rl-3", "b-3", 1, rateLimitedFields), "produce", "--topic", "ingress")

	alerts := e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(transitions(a, "acme/m1", "OPEN")) > 0 })
	open := transitions(alerts, "acme/m1", "OPEN")
	if len(open) != 1 {
		t.Fatalf("want one CLOSED->OPEN BreakerEvent for acme/m1 on alerts, got %v\nrouter logs:\n%s", alerts, r.logs.String())
	}
	o := open[0]
	// the third 429 routed opens it; the three tasks are on different
	// partitions, so which one that is depends on the batch order
	trigger := str(o, "task_id")
	if str(o, "from") != "CLOSED" || (trigger != "b-1" && trigger != "b-2" && trigger != "b-3") || str(o, "class") != "RATE_LIMITED" ||
		get(o, "failures") != 3.0 || get(o, "requests") != 3.0 || str(o, "instance") != "a" || str(o, "reason") == "" {
		t.Errorf("opening BreakerEvent = %v", o)
	}

	// the retries were due 1 s after the 429s; the breaker stays open for 8 s
	time.Sleep(time.Until(produced.Add(2500 * time.Millisecond)))
	if retries := e.tail("retry", time.Second); len(retries) != 0 {
		t.Fatalf("%d retry records while the breaker is open, want 0: %v", len(retries), retries)
	}
	if held, _ := scrape(t, r.metrics, "faultrouter_retries_held"); held != 3 {
		t.Errorf("faultrouter_retries_held = %v while open, want 3", held)
	}

	// cooldown over: half-open, one held retry released as the probe
	alerts = e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(transitions(a, "acme/m1", "HALF_OPEN")) > 0 })
	if len(transitions(alerts, "acme/m1", "HALF_OPEN")) != 1 {
		t.Fatalf("want one OPEN->HALF_OPEN BreakerEvent, got %v", alerts)
	}
	e.tailUntil("retry", 20*time.Second, func(r []map[string]any) bool { return len(r) >= 1 })
	time.Sleep(1500 * time.Millisecond) // a second probe would have been released by now
	retries := e.tail("retry", time.Second)
	if len(retries) != 1 {
		t.Fatalf("half-open released %d retries, want 1 probe: %v", len(retries), retries)
	}
	if id := str(retries[0], "task_id"); id != "b-1" && id != "b-2" && id != "b-3" {
		t.Errorf("probe retry is for task %q", id)
	}

	// the probe succeeds: a later SUCCEEDED for acme/m1 closes the breaker and
	// the other held retries are released
	e.cli(acmeEvent("ok-1", "b-ok", 1, okFields), "produce", "--topic", "ingress")
	retries = e.tailUntil("retry", 30*time.Second, func(r []map[string]any) bool { return len(r) >= 3 })
	if len(retries) != 3 {
		t.Fatalf("after the probe succeeded: %d retry records, want 3: %v\nrouter logs:\n%s", len(retries), retries, r.logs.String())
	}
	seen := map[string]bool{}
	for _, rr := range retries {
		seen[str(rr, "task_id")] = true
		if n := get(rr, "decision.retry.n"); n != 1.0 {
			t.Errorf("retry %v: plan n = %v, want 1", rr, n)
		}
	}
	if !seen["b-1"] || !seen["b-2"] || !seen["b-3"] {
		t.Errorf("retried tasks %v, want b-1, b-2, b-3", seen)
	}
	alerts = e.tail("alerts", time.Second)
	if c := transitions(alerts, "acme/m1", "CLOSED"); len(c) != 1 || str(c[0], "from") != "HALF_OPEN" || str(c[0], "task_id") != "b-ok" {
		t.Errorf("want one HALF_OPEN->CLOSED BreakerEvent triggered by b-ok, got %v", c)
	}

	for sample, want := range map[string]float64{
		`faultrouter_breaker_transitions_total{scope="PROVIDER_MODEL",to="OPEN"}`:      1,
		`faultrouter_breaker_transitions_total{scope="PROVIDER_MODEL",to="HALF_OPEN"}`: 1,
		`faultrouter_breaker_transitions_total{scope="PROVIDER_MODEL",to="CLOSED"}`:    1,
		`faultrouter_breakers{scope="PROVIDER_MODEL",state="CLOSED"}`:                  1,
		`faultrouter_breakers{scope="PROVIDER_MODEL",state="OPEN"}`:                    0,
		`faultrouter_retries_held`:            0,
		`faultrouter_retries_published_total`: 3,
		// everything produced has been consumed
		`faultrouter_consumer_lag_records{topic="` + e.prefix + `ai.tasks.ingress"}`: 0,
	} {
		if got, ok := scrape(t, r.metrics, sample); !ok || got != want {
			t.Errorf("/metrics %s = %v (present %v), want %v", sample, got, ok, want)
		}
	}
}

// Guards the log contract: every log line of a routed event carries
// its task_id, and in the text format starts with [TASK:<id>] so that one
// grep gives a task's whole story.
func TestRoutedLogLinesCarryTaskID(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	ids := []string{"log-ok", "log-net", "log-refuse"}
	e.cli(taskEvent("l-1", ids[0], 1, okFields)+taskEvent("l-2", ids[1], 1, timeoutFields)+
		taskEvent("l-3", ids[2], 1, refusalFields), "produce", "--topic", "ingress")
	e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return len(a) >= 3 })
	waitFor(10*time.Second, func() bool { return strings.Count(r.logs.String(), "msg=routed") >= 3 })

	routed := map[string]int{}
	for _, line := range strings.Split(r.logs.String(), "\n") {
		if !strings.Contains(line, "task_id=") {
			continue
		}
		if !strings.HasPrefix(line, "[TASK:") {
			t.Errorf("a line with a task_id does not start with [TASK:: %q", line)
			continue
		}
		id := line[len("[TASK:"):strings.Index(line, "]")]
		if !strings.Contains(line, "task_id="+id) {
			t.Errorf("line prefix names %q but its task_id differs: %q", id, line)
		}
		if strings.Contains(line, "msg=routed") {
			routed[id]++
		}
	}
	for _, id := range ids {
		if routed[id] != 1 {
			t.Errorf("task %s: %d routed lines, want 1", id, routed[id])
		}
	}
	if t.Failed() {
		fmt.Fprintf(os.Stderr, "router logs:\n%s\n", r.logs.String())
	}
}

// Guards the immediate alerts: MODEL_HALLUCINATION writes an ALERT and
// opens its prompt template's breaker (a TRANSITION to OPEN) at once;
// BUDGET_EXHAUSTED writes an ALERT naming the task; both are counted in
// faultrouter_alerts_total; a person's review decision on the quarantined
// item closes the template breaker again.
func TestImmediateAlerts(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	halluc := strings.Replace(taskEvent("h-1", "t-halluc", 1,
		`"status":"OK","stage":"MODEL","output":{"text":"Refund issued per policy 99.","schema_valid":true,"confidence":0.95,"flags":["fabricated_data"]}`),
		`"prompt_template":"support-v3"`, `"prompt_template":"refund-v9"`, 1)
	budget := strings.Replace(taskEvent("b-1", "t-budget", 1, timeoutFields),
		`"cost_usd":0.01`, `"cost_usd":0.75`, 1)
	e.cli(halluc+budget, "produce", "--topic", "ingress")

	alerts := e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(a) >= 3 })
	var hAlert, hOpen, bAlert int
	for _, a := range alerts {
		switch {
		case str(a, "kind") == "ALERT" && str(a, "class") == "MODEL_HALLUCINATION" && str(a, "scope") == "PROMPT_TEMPLATE" &&
			str(a, "key") == "refund-v9" && str(a, "task_id") == "t-halluc":
			hAlert++
		case str(a, "kind") == "TRANSITION" && str(a, "scope") == "PROMPT_TEMPLATE" && str(a, "key") == "refund-v9" &&
			str(a, "from") == "CLOSED" && str(a, "to") == "OPEN" && str(a, "task_id") == "t-halluc":
			hOpen++
		case str(a, "kind") == "ALERT" && str(a, "class") == "BUDGET_EXHAUSTED" && str(a, "scope") == "TASK" &&
			str(a, "key") == "t-budget" && str(a, "task_id") == "t-budget":
			bAlert++
		}
	}
	if hAlert != 1 || hOpen != 1 || bAlert != 1 || len(alerts) != 3 {
		t.Fatalf("alerts: hallucination alert %d, template opened %d, budget alert %d (want 1 each, 3 records): %v\nlogs:\n%s",
			hAlert, hOpen, bAlert, alerts, r.logs.String())
	}
	for sample, want := range map[string]float64{
		`faultrouter_alerts_total{class="MODEL_HALLUCINATION"}`:                    1,
		`faultrouter_alerts_total{class="BUDGET_EXHAUSTED"}`:                       1,
		`faultrouter_breakers{scope="PROMPT_TEMPLATE",state="OPEN"}`:               1,
		`faultrouter_breaker_transitions_total{scope="PROMPT_TEMPLATE",to="OPEN"}`: 1,
	} {
		if got, ok := scrape(t, r.metrics, sample); !ok || got != want {
			t.Errorf("/metrics %s = %v (present %v), want %v", sample, got, ok, want)
		}
	}

	// a person decides the quarantined item: the template breaker closes
	e.cli("", "review", "decide", "--task", "t-halluc", "--reject", "--reason", "fabricated policy number", "--reviewer", "ana")
	alerts = e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(a) >= 4 })
	var closed []map[string]any
	for _, a := range alerts {
		if str(a, "scope") == "PROMPT_TEMPLATE" && str(a, "key") == "refund-v9" && str(a, "to") == "CLOSED" {
			closed = append(closed, a)
		}
	}
	if len(closed) != 1 || str(closed[0], "from") != "OPEN" || str(closed[0], "task_id") != "t-halluc" ||
		!strings.Contains(str(closed[0], "reason"), "ana") {
		t.Fatalf("after the review decision: want one OPEN->CLOSED for refund-v9 naming the reviewer, got %v", closed)
	}
	if got, _ := scrape(t, r.metrics, `faultrouter_breakers{scope="PROMPT_TEMPLATE",state="OPEN"}`); got != 0 {
		t.Errorf("open template breakers after the reset = %v, want 0", got)
	}
}
