package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Guards docs/design.md's "an open review item past its owner's SLA raises an
// alert": an UNCLASSIFIED item left open past the operations owner's SLA
// raises exactly one ALERT (scope TASK) naming the owner on the alerts topic,
// and an item a person decided within the SLA raises none.
func TestReviewPastOwnerSLAAlertsOnce(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("owners:\n  operations:\n    sla_ms: 3000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.startRouter("a", t.TempDir(), "--policy", pol)
	odd := `"status":"ERROR","stage":"PROTOCOL","error":{"type":"TLSHandshakeError","message":"unknown authority"}`
	e.cli(taskEvent("s-1", "t-slow", 1, odd)+taskEvent("f-1", "t-fast", 1, odd), "produce", "--topic", "ingress")
	// a reviewer decides what the review topic shows
	e.tailUntil("review", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-fast")) == 1 })
	e.cli("", "review", "decide", "--task", "t-fast", "--reject", "--reason", "certificate rotated", "--reviewer", "ana")

	slaAlerts := func(a []map[string]any) map[string]int {
		n := map[string]int{}
		for _, x := range a {
			if str(x, "scope") == "TASK" && str(x, "kind") == "ALERT" && strings.Contains(str(x, "reason"), "SLA") {
				n[str(x, "task_id")]++
			}
		}
		return n
	}
	e.tailUntil("alerts", 60*time.Second, func(a []map[string]any) bool { return slaAlerts(a)["t-slow"] >= 1 })
	// let many more sweeps (one per 200 ms tick) pass the deadline, then count
	time.Sleep(3 * time.Second)
	alerts := e.tail("alerts", 2*time.Second)
	n := slaAlerts(alerts)
	if n["t-slow"] != 1 || n["t-fast"] != 0 {
		t.Fatalf("SLA alerts per task = %v, want exactly one for t-slow and none for t-fast; alerts: %v\nlogs:\n%s", n, alerts, r.logs.String())
	}
	for _, x := range alerts {
		if str(x, "task_id") == "t-slow" && strings.Contains(str(x, "reason"), "SLA") {
			if str(x, "class") != "UNCLASSIFIED" || !strings.Contains(str(x, "reason"), "operations") {
				t.Errorf("SLA alert %v: want class UNCLASSIFIED and the owner operations named", x)
			}
		}
	}
}

// Guards the life of an open review item on the real broker, as a user meets
// it on a time-compressed policy (default_sla_ms 3 s: a task's state lives
// 6 s; ai_product's response SLA 20 s, longer than that TTL, as 72 h is
// longer than the default 48 h). A reviewer's approval of a refusal 9 s
// after it, past the task's TTL, is applied: a retry with the same task ID
// reaches the retry topic (it was dropped as review.no_open_item). A second
// refusal left open past the owner's SLA raises its overdue alert. A task
// that completed meanwhile is forgotten: an exact redelivery of its event
// after its TTL is routed again, not dropped.
func TestReviewApprovedAfterTheTaskTTLIsRetried(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("default_sla_ms: 3000\nowners:\n  ai_product:\n    sla_ms: 20000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.startRouter("a", t.TempDir(), "--policy", pol)
	done := taskEvent("d-1", "t-done", 1, okFields)
	e.cli(taskEvent("r-1", "t-late", 1, refusalFields)+taskEvent("r-2", "t-open", 1, refusalFields)+done, "produce", "--topic", "ingress")
	e.tailUntil("review", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-late")) == 1 })

	time.Sleep(9 * time.Second) // past the tasks' 6 s TTL, within the owner's 20 s SLA
	e.cli(done, "produce", "--topic", "ingress")
	e.cli("", "review", "decide", "--task", "t-late", "--approve", "--reason", "the question was fine", "--reviewer", "ana")

	retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-late")) == 1 })
	audit := e.tailUntil("audit", 30*time.Second, func(a []map[string]any) bool { return len(byTask(a, "t-done")) == 2 })
	var rules []string
	for _, x := range byTask(audit, "t-late") {
		rules = append(rules, str(x, "decision.rule"))
	}
	if len(byTask(retries, "t-late")) != 1 || !slices.Contains(rules, "MANUAL_OVERRIDE_SUCCESS") {
		t.Errorf("the approval after the task's TTL: %d retries of t-late and audit rules %v, want 1 retry by MANUAL_OVERRIDE_SUCCESS",
			len(byTask(retries, "t-late")), rules)
	}
	if d := byTask(audit, "t-done"); len(d) != 2 || str(d[1], "decision.route") != "COMPLETE" || get(d[1], "decision.totals.attempts") != float64(1) {
		t.Errorf("redelivery of the completed task after its TTL: %v, want routed afresh (COMPLETE, attempts 1)", d)
	}

	overdue := func(a []map[string]any) bool {
		for _, x := range byTask(a, "t-open") {
			if str(x, "kind") == "ALERT" && strings.Contains(str(x, "reason"), "SLA") {
				return true
			}
		}
		return false
	}
	if alerts := e.tailUntil("alerts", 60*time.Second, overdue); !overdue(alerts) {
		t.Errorf("no overdue alert for the item open past ai_product's 20 s SLA; alerts %v\nlogs:\n%s", alerts, r.logs.String())
	}
}
