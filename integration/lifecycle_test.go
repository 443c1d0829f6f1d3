package integration

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Guards exactly-once publication of due retries across a pause: an instance
// frozen (SIGSTOP) past the group's session timeout, while its successor
// takes its partitions and publishes the retries that fell due, must not
// publish them again when it wakes (SIGCONT). A transaction holding only due
// retries consumes nothing, so it is fenced by the group generation only if
// it commits offsets too (router.fence). On waking, the instance's heartbeat
// usually learns of the eviction first; TestZombieCannotPublishDueRetry in
// internal/router covers, deterministically, the window where it does not.
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

// Guards the restore against stale local state: Pebble keeps the tasks of a
// partition this instance stopped owning. While it was away, another owner
// published the task's retry, the task expired, and compaction dropped every
// record of the task, its tombstone included. The changelog then holds
// nothing of the task, and the instance's checkpoint still lies within the
// changelog: restoring from the checkpoint alone would keep the stale
// pending retry and publish it again. The changelog is made so here with
// DeleteRecords (what compaction leaves: no record of the task before or
// after the checkpoint) and an unrelated record another owner wrote.
func TestStaleLocalStateIsNotRestored(t *testing.T) {
	e := newEnv(t)
	dir, pol := t.TempDir(), quietBreakers(t)
	a := e.startRouter("a", dir, pol...)
	e.cli(taskEvent("s-1", "t-stale", 1, strings.Replace(rateLimitedFields, `"retry_after_ms":1000`, `"retry_after_ms":15000`, 1)),
		"produce", "--topic", "ingress")
	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-stale")) >= 1 })
	if route := str(byTask(audit, "t-stale")[0], "decision.route"); route != "RETRY" {
		t.Fatalf("t-stale: route %s, want RETRY", route)
	}
	a.stop(t) // Pebble holds t-stale with its pending retry

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stateTopic := e.prefix + "faultrouter.state"
	var p int32 = -1
	var end int64
	for _, r := range readTopic(ctx, t, stateTopic, true) {
		if string(r.Key) == "t-stale" {
			p, end = r.Partition, r.Offset+1
		}
	}
	if p < 0 {
		t.Fatal("no changelog record of t-stale")
	}
	adm := kadm.NewClient(kafkaClient(t))
	// compaction's result: no record of t-stale is left (DeleteRecords needs
	// the delete policy, so it is added for the moment)
	setPolicy := func(policy string) {
		t.Helper()
		if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "cleanup.policy", Value: kadm.StringPtr(policy)}}, stateTopic); err != nil {
			t.Fatal(err)
		}
	}
	setPolicy("compact,delete")
	var offs kadm.Offsets
	offs.Add(kadm.Offset{Topic: stateTopic, Partition: p, At: end})
	if resp, err := adm.DeleteRecords(ctx, offs); err != nil || resp.Error() != nil {
		t.Fatalf("delete records: %v %v", err, resp.Error())
	}
	setPolicy("compact")
	// another owner's record of another task, after the checkpoint
	other := kafkaClient(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := other.ProduceSync(ctx, &kgo.Record{Topic: stateTopic, Partition: p, Key: []byte("t-other")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// a comes back to its state directory and the partition; the retry
	// would have been due 15 s after the 429
	a = e.startRouter("a", dir, pol...)
	retries := e.tail("retry", 20*time.Second)
	if n := len(byTask(retries, "t-stale")); n != 0 {
		t.Errorf("t-stale: %d retries published from stale local state; the changelog holds nothing of the task; logs:\n%s", n, a.logs.String())
	}
}
