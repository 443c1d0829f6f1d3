package integration

import (
	"os"
	"path/filepath"
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
