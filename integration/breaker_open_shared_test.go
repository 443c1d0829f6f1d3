package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Guards "trip anywhere, hold everywhere": with three router instances, one
// partition each, a provider/model breaker that opens on one instance (only
// its partition saw the failures, fewer than min_requests on the others)
// holds the due retries of that provider/model on the other two: the OPEN
// state reaches them through the breakers topic within about a tick, and
// they publish no retry into it. When its cooldown ends, the three
// instances together let half_open_probes (1) retry through, not one each.
// `breaker reset` then releases the held retries on every instance, each
// exactly once. Real default policy
// (provider/model breaker: 20 requests, ratio 0.5, cooldown 30 s).
func TestOpenBreakerHoldsRetriesOnEveryInstance(t *testing.T) {
	e := newEnv(t)
	rs := map[string]*router{}
	for _, id := range []string{"a", "b", "c"} {
		rs[id] = e.startRouter(id, t.TempDir())
	}
	logs := func() string {
		var s strings.Builder
		for id, r := range rs {
			fmt.Fprintf(&s, "router %s:\n%s\n", id, r.logs.String())
		}
		return s.String()
	}
	acme := func(line, action, tpl string) string {
		line = strings.Replace(line, `"provider":"openai","model":"gpt-4o"`, `"provider":"acme","model":"m1"`, 1)
		line = strings.Replace(line, `"action":"answer_ticket"`, `"action":"`+action+`"`, 1)
		return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
	}
	// 20 timeouts of acme/m1, all on partition 0: its owner opens the
	// breaker (each of another action and template, which stay closed)
	var in strings.Builder
	var failing []string
	for i := 0; len(failing) < 20; i++ {
		id := fmt.Sprintf("op-fail-%d", i)
		if murmur2Partition(id, 3) != 0 {
			continue
		}
		failing = append(failing, id)
		in.WriteString(acme(taskEvent("f-"+id, id, 1, timeoutFields), fmt.Sprintf("fail_%d", i), fmt.Sprintf("fail-v%d", i)))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")
	opened := func(a []map[string]any) map[string]bool {
		by := map[string]bool{}
		for _, x := range a {
			if str(x, "scope") == "PROVIDER_MODEL" && str(x, "key") == "acme/m1" && str(x, "kind") == "TRANSITION" && str(x, "to") == "OPEN" {
				by[str(x, "instance")] = true
			}
		}
		return by
	}
	a := e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(opened(a)) >= 1 })
	if len(opened(a)) == 0 {
		t.Fatalf("acme/m1 did not open on any instance: %v\n%s", a, logs())
	}
	openedAt := time.Now()
	for _, x := range a {
		if str(x, "key") == "acme/m1" && str(x, "to") == "OPEN" {
			if at, err := time.Parse(time.RFC3339Nano, str(x, "at")); err == nil && at.Before(openedAt) {
				openedAt = at
			}
		}
	}
	// a tick or so for the other instances to read it (not asserted: the
	// retries below are)
	time.Sleep(2 * time.Second)

	// timeouts of acme/m1 on partitions 1 and 2 (other action and template,
	// so only the provider/model breaker guards them): too few to open it on
	// their own instances; their retries (due 1 s later) must be held
	var tasks []string
	in.Reset()
	for i := 0; len(tasks) < 4; i++ {
		id := fmt.Sprintf("op-held-%d", i)
		if p := murmur2Partition(id, 3); p == 0 || len(tasks) < 2 && p != 1 || len(tasks) >= 2 && p != 2 {
			continue
		}
		tasks = append(tasks, id)
		in.WriteString(acme(taskEvent("h-"+id, id, 1, timeoutFields), "answer_ticket", "support-v3"))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")
	audit := e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool {
		n := 0
		for _, id := range tasks {
			n += len(byTask(a, id))
		}
		return n == len(tasks)
	})
	for _, id := range tasks {
		if recs := byTask(audit, id); len(recs) != 1 || str(recs[0], "decision.route") != "RETRY" {
			t.Fatalf("task %s: audit %v, want one RETRY decision\n%s", id, recs, logs())
		}
	}
	time.Sleep(3 * time.Second)
	retries := e.tail("retry", time.Second)
	for _, id := range tasks {
		if n := len(byTask(retries, id)); n != 0 {
			t.Errorf("task %s (partition %d): %d retries published into acme/m1, open on instance(s) %v, want 0 (held)\n",
				id, murmur2Partition(id, 3), n, opened(e.tailNow("alerts")))
		}
	}
	if t.Failed() {
		t.Fatal(logs())
	}

	// the cooldown (30 s) ends: the instance that opened acme/m1 half-opens
	// it and lets its one probe through; the other two, which adopted the
	// OPEN, let that probe be the only one (not one per instance)
	time.Sleep(time.Until(openedAt.Add(45 * time.Second)))
	probes := 0
	retries = e.tailNow("retry")
	for _, id := range append(append([]string{}, failing...), tasks...) {
		probes += len(byTask(retries, id))
	}
	if probes != 1 {
		t.Errorf("%d retries of acme/m1 published while it was half-open, want 1 (half_open_probes), from one instance", probes)
	}

	// a person's reset closes acme/m1 on every instance; each held retry
	// is published once, by the instance that owns its task
	e.cli("", "breaker", "reset", "--scope", "PROVIDER_MODEL", "--key", "acme/m1", "--reason", "provider recovered", "--operator", "ops-lee")
	released := func(r []map[string]any) bool {
		for _, id := range tasks {
			if len(byTask(r, id)) == 0 {
				return false
			}
		}
		return true
	}
	e.tailUntil("retry", 60*time.Second, released)
	retries = e.tail("retry", 2*time.Second)
	for _, id := range append(append([]string{}, failing...), tasks...) {
		if n := len(byTask(retries, id)); n != 1 {
			t.Errorf("task %s: %d retries after the reset, want 1", id, n)
		}
	}
	if t.Failed() {
		t.Log(logs())
	}
}
