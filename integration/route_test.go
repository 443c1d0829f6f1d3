package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// taskEvent returns one TaskEvent JSON line.
func taskEvent(eventID, taskID string, attempt int, extra string) string {
	line := fmt.Sprintf(`{"event_id":%q,"task_id":%q,"attempt":%d,"occurred_at":%q,"source":"it","action":"answer_ticket","provider":"openai","model":"gpt-4o","prompt_template":"support-v3","usage":{"cost_usd":0.01,"tokens":100,"elapsed_ms":500}`,
		eventID, taskID, attempt, time.Now().UTC().Format(time.RFC3339Nano))
	if extra != "" {
		line += "," + extra
	}
	return line + "}\n"
}

const (
	okFields      = `"status":"OK","stage":"MODEL","output":{"text":"Your refund was issued.","schema_valid":true,"confidence":0.93}`
	timeoutFields = `"status":"ERROR","stage":"NETWORK","error":{"type":"TimeoutError","http_status":504,"message":"upstream timed out"}`
	refusalFields = `"status":"OK","stage":"MODEL","output":{"text":"I cannot help with that request.","schema_valid":true,"confidence":0.9}`
)

func byTask(recs []map[string]any, taskID string) []map[string]any {
	var out []map[string]any
	for _, r := range recs {
		if str(r, "task_id") == taskID {
			out = append(out, r)
		}
	}
	return out
}

// Guards the spine of docs/design.md end to end on the real broker, through the
// CLI a user runs: SUCCEEDED completes, NETWORK_TIMEOUT is retried twice (each
// retry published to the retry topic when due) and then dead-lettered,
// MODEL_REFUSAL goes to review, and every input record has exactly one audit
// record carrying its decision.
func TestRoutesSucceededTimeoutRefusal(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())

	e.cli(taskEvent("ok-1", "t-ok", 1, okFields)+taskEvent("ref-1", "t-refuse", 1, refusalFields)+
		taskEvent("net-1", "t-net", 1, timeoutFields), "produce", "--topic", "ingress")

	// the worker waits for each retry before its next attempt
	for n := 1; n <= 2; n++ {
		retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-net")) >= n })
		if got := len(byTask(retries, "t-net")); got != n {
			t.Fatalf("after attempt %d: %d retry records for t-net, want %d", n, got, n)
		}
		e.cli(taskEvent(fmt.Sprintf("net-%d", n+1), "t-net", n+1, timeoutFields), "produce", "--topic", "ingress")
	}

	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(r) >= 5 })
	if len(audit) != 5 {
		t.Fatalf("audit has %d records, want 5 (one per input): %v", len(audit), audit)
	}
	want := map[string][]string{
		"t-ok":     {"SUCCEEDED/COMPLETE"},
		"t-refuse": {"MODEL_REFUSAL/REVIEW"},
		"t-net":    {"NETWORK_TIMEOUT/RETRY", "NETWORK_TIMEOUT/RETRY", "NETWORK_TIMEOUT/DEADLETTER"},
	}
	seen := map[string]bool{}
	for task, routes := range want {
		recs := byTask(audit, task)
		if len(recs) != len(routes) {
			t.Fatalf("%s: %d audit records, want %d", task, len(recs), len(routes))
		}
		for i, r := range recs {
			got := str(r, "decision.class") + "/" + str(r, "decision.route")
			if got != routes[i] {
				t.Errorf("%s audit %d: %s, want %s (reason %q)", task, i, got, routes[i], str(r, "decision.reason"))
			}
			at := fmt.Sprintf("%v/%v/%v", get(r, "input.topic"), get(r, "input.partition"), get(r, "input.offset"))
			if seen[at] {
				t.Errorf("two audit records for input %s", at)
			}
			seen[at] = true
		}
	}

	retries := byTask(e.tail("retry", 2*time.Second), "t-net")
	if len(retries) != 2 {
		t.Fatalf("retry topic: %d records for t-net, want 2", len(retries))
	}
	for i, r := range retries {
		if n, _ := get(r, "decision.retry.n").(float64); int(n) != i+1 {
			t.Errorf("retry %d carries n=%v", i+1, get(r, "decision.retry.n"))
		}
		if d, _ := get(r, "decision.retry.delay_ms").(float64); int(d) != 1000*(i+1) {
			t.Errorf("retry %d delay %v ms, want %d", i+1, get(r, "decision.retry.delay_ms"), 1000*(i+1))
		}
		if str(r, "event_id") != fmt.Sprintf("net-%d", i+1) {
			t.Errorf("retry %d carries event %s, want the original net-%d", i+1, str(r, "event_id"), i+1)
		}
	}
	dl := e.tail("deadletter", 2*time.Second)
	if len(dl) != 1 || str(dl[0], "task_id") != "t-net" || str(dl[0], "decision.rule") != "network_timeout.exhausted" {
		t.Errorf("deadletter: want the third timeout of t-net, got %v", dl)
	}
	review := e.tail("review", 2*time.Second)
	if len(review) != 1 || str(review[0], "task_id") != "t-refuse" || str(review[0], "decision.class") != "MODEL_REFUSAL" {
		t.Errorf("review: want the refusal of t-refuse, got %v", review)
	}
	if owner := str(review[0], "decision.review.owner"); !strings.Contains(owner, "ai") {
		t.Errorf("review owner %q, want the AI product owner", owner)
	}
}
