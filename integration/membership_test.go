package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// Guards the shutdown of a static group member (--static-membership, as the
// Helm chart runs its StatefulSet): on SIGTERM the router leaves the group
// itself, so the other instance takes its partitions over at once and routes
// their events, long before the session timeout (60 s here) would have
// moved them; and a restart under the same instance ID joins as the same
// static member. Without the leave, a's partitions stay assigned to a's
// departed member until the session times out and their events wait.
func TestStaticMemberHandsOverOnShutdown(t *testing.T) {
	e := newEnv(t)
	flags := []string{"--static-membership", "--session-timeout", "60s"}
	a := e.startRouter("a", t.TempDir(), flags...)
	b := e.startRouter("b", t.TempDir(), flags...)
	adm := kadm.NewClient(kafkaClient(t))
	group := e.prefix + "router"
	ingress := e.prefix + "ai.tasks.ingress"

	// the group's members by instance ID, and each one's ingress partitions
	members := func() map[string][]int32 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := adm.DescribeGroups(ctx, group)
		if err != nil || d.Error() != nil {
			return nil
		}
		out := map[string][]int32{}
		for _, m := range d[group].Members {
			id := "<dynamic>"
			if m.InstanceID != nil {
				id = *m.InstanceID
			}
			if ca, ok := m.Assigned.AsConsumer(); ok {
				for _, tp := range ca.Topics {
					if tp.Topic == ingress {
						out[id] = append(out[id], tp.Partitions...)
					}
				}
			}
			if _, ok := out[id]; !ok {
				out[id] = nil
			}
		}
		return out
	}
	var before map[string][]int32
	if !waitFor(60*time.Second, func() bool {
		before = members()
		return len(before["a"]) > 0 && len(before["b"]) > 0 && len(before) == 2
	}) {
		t.Fatalf("the group did not settle on static members a and b with partitions each: %v", before)
	}

	a.stop(t)
	stopped := time.Now()
	var tasks strings.Builder
	for i := range 12 {
		tasks.WriteString(taskEvent(fmt.Sprintf("hand-%d", i), fmt.Sprintf("t-hand-%d", i), 1, `"status":"OK","stage":"MODEL","output":{"text":"done","schema_valid":true,"confidence":0.95}`))
	}
	e.cli(tasks.String(), "produce", "--topic", "ingress")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	onA := 0
	for _, r := range readTopic(ctx, t, ingress, true) {
		if strings.HasPrefix(string(r.Key), "t-hand-") && slices.Contains(before["a"], r.Partition) {
			onA++
		}
	}
	if onA == 0 {
		t.Fatalf("none of the 12 tasks is on a partition of a (%v): the test proves nothing", before["a"])
	}
	// half the session timeout: a partition left to it would still wait
	audit := e.tailUntil("audit", 30*time.Second, func(r []map[string]any) bool {
		for i := range 12 {
			if len(byTask(r, fmt.Sprintf("t-hand-%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	for i := range 12 {
		if len(byTask(audit, fmt.Sprintf("t-hand-%d", i))) == 0 {
			t.Fatalf("t-hand-%d not decided %s after a stopped (session timeout 60 s; %d of the tasks on a's partitions %v): "+
				"a did not hand its partitions over; group now %v; b's logs:\n%s", i, time.Since(stopped).Round(time.Second), onA, before["a"], members(), b.logs.String())
		}
	}
	if m := members(); len(m) != 1 || len(m["b"]) != 3 {
		t.Errorf("group after a stopped: %v, want b alone with the 3 partitions", m)
	}

	// a comes back under its instance ID and gets its partitions back
	a = e.startRouter("a", t.TempDir(), flags...)
	var after map[string][]int32
	if !waitFor(60*time.Second, func() bool {
		after = members()
		return len(after) == 2 && len(after["a"]) > 0 && len(after["b"]) > 0
	}) {
		t.Errorf("a did not rejoin as static member a: group %v; a's logs:\n%s", after, a.logs.String())
	}
}

// Guards the fence of a departed static member's open transaction: static
// member a freezes (SIGSTOP) in the middle of a transaction while a stream
// runs, and stays frozen past the session timeout. The group moves its
// partitions to b; b finds a gone with its transaction open and fences a's
// transactional ID itself (the broker aborts the transaction at once, not
// at the transaction timeout), then restores and routes a's partitions:
// every event produced while a was frozen is decided exactly once. The
// real policy, breakers on.
func TestDepartedStaticMembersTransactionIsFenced(t *testing.T) {
	e := newEnv(t)
	flags := []string{"--static-membership", "--session-timeout", "6s"}
	a := e.startRouter("a", t.TempDir(), flags...)
	b := e.startRouter("b", t.TempDir(), flags...)
	adm := kadm.NewClient(kafkaClient(t))
	txnID := e.prefix + "router-a"

	// a steady stream, so that a is in a transaction most of the time
	stop := make(chan struct{})
	streamed := make(chan int, 1)
	go func() {
		n := 0
		defer func() { streamed <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var batch strings.Builder
			for range 20 {
				batch.WriteString(taskEvent(fmt.Sprintf("fence-%d", n), fmt.Sprintf("t-fence-%d", n), 1, `"status":"OK","stage":"MODEL","output":{"text":"done","schema_valid":true,"confidence":0.95}`))
				n++
			}
			e.cli(batch.String(), "produce", "--topic", "ingress")
		}
	}()
	ongoing := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		open, err := adm.ListTransactions(ctx, nil, []string{"Ongoing"})
		if err != nil {
			return false
		}
		_, ok := open[txnID]
		return ok
	}
	// freeze a until it is frozen inside a transaction: open when a stopped
	// and still open a moment later (an end a sent just before it stopped
	// would complete the transaction without a, leaving nothing to fence)
	pid := a.cmd.Process.Pid
	frozen := false
	for try := 0; try < 200 && !frozen; try++ {
		syscall.Kill(-pid, syscall.SIGSTOP)
		if frozen = ongoing(); frozen {
			time.Sleep(300 * time.Millisecond)
			frozen = ongoing()
		}
		if !frozen {
			syscall.Kill(-pid, syscall.SIGCONT)
			time.Sleep(time.Duration(20+try%7*10) * time.Millisecond)
		}
	}
	if !frozen {
		close(stop)
		t.Fatalf("a was never frozen inside a transaction of %s in 200 tries", txnID)
	}
	defer a.kill()
	if !waitFor(60*time.Second, func() bool {
		return strings.Contains(b.logs.String(), "fenced the open transaction of a member that left the group") &&
			strings.Contains(b.logs.String(), txnID)
	}) {
		close(stop)
		var group []string // b's lines of the group and the fence
		for _, l := range strings.Split(b.logs.String(), "\n") {
			if strings.Contains(l, "fenc") || strings.Contains(l, "session begun") || strings.Contains(l, "restor") {
				group = append(group, l)
			}
		}
		t.Fatalf("b did not fence a's open transaction %s (open now: %v); b's lines of the group, the fence and the restore:\n%s",
			txnID, ongoing(), strings.Join(group, "\n"))
	}
	if ongoing() {
		t.Errorf("a's transaction %s is still open after b fenced it", txnID)
	}
	close(stop)
	n := <-streamed
	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool {
		for i := range n {
			if len(byTask(r, fmt.Sprintf("t-fence-%d", i))) == 0 {
				return false
			}
		}
		return true
	})
	for i := range n {
		if got := len(byTask(audit, fmt.Sprintf("t-fence-%d", i))); got != 1 {
			t.Fatalf("t-fence-%d has %d audit records, want exactly 1 (%d tasks streamed); b's logs:\n%s", i, got, n, tailLines(b.logs.String(), 60))
		}
	}
}
