package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Guards the restore of a state this build cannot read, under the
// reference-model checker: a build outside the upgrade window (built with
// the nextstate tag: it writes every task state with a TaskState schema
// one version past this build's) routes the checker's workload on the
// compressed policy, and this build joins its group on an empty state
// directory, so it restores from the changelog, where every state is one it
// cannot read. It must stop at the first such record (the restore error
// names the record and the writer schema, restore_unreadable_records_total
// counts it, /readyz stays false), never route its partitions on the
// states before it or on none; it is stopped, and the other build routes
// on. The checker must find nothing lost or duplicated. A restore that
// skipped the records it could not read would route the moved tasks as new
// ones (their attempts, dedup sets, pending retries and held writes gone),
// and the checker would report it.
func TestCheckerUnreadableState(t *testing.T) {
	next := filepath.Join(t.TempDir(), "faultrouter-nextstate")
	build := exec.Command("go", "build", "-tags", "nextstate", "-o", next, "../cmd/faultrouter")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build the nextstate router: %v", err)
	}
	seed := checkerSeed(t)
	join := func(c *cluster, began time.Time, produced *atomic.Int64) []string {
		if w := time.Until(began.Add(6 * time.Second)); w > 0 {
			time.Sleep(w)
		}
		// this build, on an empty state directory: it restores from the changelog
		c.starts["old"] = append(c.starts["old"], time.Now())
		r := c.e.launchRouter(binary, "old", t.TempDir(), c.args...)
		c.routers["old"] = r
		stopped := waitFor(60*time.Second, func() bool {
			out, err := httpGet(r.metrics + "/metrics")
			n, _ := metricValue(out, "faultrouter_restore_unreadable_records_total")
			return err == nil && n > 0
		})
		time.Sleep(5 * time.Second) // long enough to route, had it gone on
		ready := httpOK(r.metrics + "/readyz")
		logs := r.logs.String()
		r.kill()
		delete(c.routers, "old")
		switch {
		case !stopped:
			t.Errorf("this build did not count a changelog record it cannot read within 60 s; logs:\n%s", tailLines(logs, 30))
		case ready:
			t.Errorf("this build answered /readyz while a restore had stopped at a record it cannot read")
		case !strings.Contains(logs, "changelog record this build cannot read") || !strings.Contains(logs, "writer schema fingerprint"):
			t.Errorf("the restore error does not name the record and its writer schema; logs:\n%s", tailLines(logs, 30))
		}
		return []string{fmt.Sprintf("join-unreadable (stopped at an unreadable record: %v, ready: %v)", stopped, ready)}
	}
	res := runChecker(t, checkerConfig{seed: seed, tasks: 8000, duration: 15 * time.Second, binary: next, schedule: join, compressed: true})
	printSummary(os.Stdout, []checkerResult{res})
	if bad := unexpected(t, res.rep); len(bad) > 0 {
		t.Fatalf("the router's outputs differ from the model: %v (seed %d; JSON report %s)", bad, seed, res.jsonPath)
	}
}
