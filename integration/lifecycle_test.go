package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Guards exactly-once publication of due retries across a pause: an instance
// frozen (SIGSTOP) past the group's session timeout, while its successor
// takes its partitions and publishes the retries that fell due, must not
// publish them again when it wakes (SIGCONT). A transaction holding only due
// retries consumes nothing, so it is fenced by the group generation only if
// it commits offsets too (router.fence). On waking, the instance's heartbeat
// usually learns of the eviction first; TestZombieCannotPublishDueRetry in
// pkg/router covers, deterministically, the window where it does not.
func TestPausedInstanceCannotPublishDueRetry(t *testing.T) {
	e := newEnv(t)
	pol := quietBreakers(t)
	a := e.startRouter("a", t.TempDir(), pol...)

	// a has published a retry before (a long-running instance knows the
	// retry topic: waking, it publishes without a metadata round trip first)
	e.cli(taskEvent("p-warm", "t-warm", 1, strings.Replace(rateLimitedFields, `"retry_after_ms":1000`, `"retry_after_ms":0`, 1)),
		"produce", "--topic", "ingress")
	if len(e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(r) >= 1 })) != 1 {
		t.Fatal("the warm-up retry was not published")
	}

	// retries decided by a, due 6 s later
	const tasks = 6
	var in strings.Builder
	for i := range tasks {
		in.WriteString(taskEvent(fmt.Sprintf("p-%d", i), fmt.Sprintf("t-pause-%d", i), 1,
			strings.Replace(rateLimitedFields, `"retry_after_ms":1000`, `"retry_after_ms":6000`, 1)))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")
	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(r) >= tasks+1 })
	for _, r := range audit {
		if route := str(r, "decision.route"); route != "RETRY" {
			t.Fatalf("audit %s: route %s, want RETRY (rule %s)", str(r, "task_id"), route, str(r, "decision.rule"))
		}
	}
	if n := len(e.tailNow("retry")); n != 1 {
		t.Fatalf("%d retries published, want only the warm-up one: the others are not due yet", n)
	}

	// a freezes; b takes the partitions once a's session times out, and
	// publishes the retries when due
	if err := syscall.Kill(-a.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	b := e.startRouter("b", t.TempDir(), pol...)
	retries := e.tailUntil("retry", 90*time.Second, func(r []map[string]any) bool { return len(r) >= tasks+1 })
	if len(retries) != tasks+1 {
		t.Fatalf("b published %d retries, want %d; b's logs:\n%s", len(retries)-1, tasks, b.logs.String())
	}

	// a wakes, still holding the pending retries in its store, now due
	if err := syscall.Kill(-a.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// a's group membership is gone; give it the time to act on what it held
	got := e.tail("retry", 10*time.Second)
	for i := range tasks {
		id := fmt.Sprintf("t-pause-%d", i)
		if n := len(byTask(got, id)); n != 1 {
			t.Errorf("%s: %d retry records, want exactly 1", id, n)
		}
	}
	if t.Failed() {
		t.Logf("a's logs after SIGCONT:\n%s", tailLines(a.logs.String(), 60))
	}
}

// tailLines returns the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
