package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// previousRelease builds the router of the previous release from the
// repository's own history: its commit is named in previous-release, so
// the test needs nothing outside the clone.
func previousRelease(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("previous-release")
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.TrimSpace(string(b))
	src := t.TempDir()
	archive := exec.Command("bash", "-c", `git -C .. archive --format=tar "$1" | tar -x -C "$2"`, "archive", commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("the previous release %s is not in this clone's history (git archive: %v): %s", commit, err, out)
	}
	bin := filepath.Join(t.TempDir(), "faultrouter-previous")
	build := exec.Command("go", "build", "-o", bin, "./cmd/faultrouter")
	build.Dir = src
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build the previous release %s: %v", commit, err)
	}
	t.Logf("previous release: %s built from commit %s", bin, commit)
	return bin
}

// Guards the upgrade window: a deploy rolls forward and back while the
// changelog holds the task states of both builds. The previous release
// (previous-release) and this build run in one consumer group on the real
// broker under the checker's workload: the previous release alone, then
// both, then this build alone, then back to the previous release, and
// forward again, each roll a stop or a SIGKILL and a restart on the same
// state directory. Every output must match what the policy computes from
// the committed input log: nothing lost or duplicated across the rolls.
func TestUpgradeAndRollback(t *testing.T) {
	old := previousRelease(t)
	seed := checkerSeed(t)
	roll := func(c *cluster, began time.Time, produced *atomic.Int64) []string {
		st := &schedule{t: t, began: began, produced: produced}
		at := st.at
		at(3*time.Second, "mixed", func() { c.startBin("b", binary) }) // a: previous, b: this build
		at(8*time.Second, "forward", func() {
			c.routers["a"].stop(t)
			c.startBin("a", binary)
		})
		at(13*time.Second, "rollback", func() {
			c.routers["b"].kill()
			c.startBin("b", old)
			c.routers["a"].stop(t)
			c.startBin("a", old)
		})
		at(20*time.Second, "forward-again", func() {
			// the previous release skipped a changelog record it could not
			// read, with this log line: it must have read every state
			// this build wrote
			for _, n := range []string{"a", "b"} {
				if logs := c.routers[n].logs.String(); strings.Contains(logs, "does not decode") {
					t.Errorf("the previous release (%s) could not read a state this build wrote:\n%s", n, tailLines(logs, 20))
				}
			}
			c.routers["a"].kill()
			c.startBin("a", binary)
			c.routers["b"].stop(t)
			c.startBin("b", binary)
		})
		return st.done
	}
	res := runChecker(t, checkerConfig{seed: seed, tasks: 12_000, duration: 25 * time.Second, binary: old, previous: old, schedule: roll})
	printSummary(os.Stdout, []checkerResult{res})
	changed, total := 0, 0
	for _, n := range res.rep.ViolationsByCheck {
		total += n
	}
	if total > len(res.rep.Violations) {
		t.Fatalf("%d violations, more than the report lists (%d): %v (JSON report %s)", total, len(res.rep.Violations), res.rep.ViolationsByCheck, res.jsonPath)
	}
	var bad []string
	for _, v := range res.rep.Violations {
		if releaseChange(v.Check, v.Detail) {
			changed++
			continue
		}
		bad = append(bad, v.Check+": "+v.Task+": "+v.Detail)
	}
	t.Logf("%d decisions differ from this build's model as the previous release decided them (a reviewer's decision on an OUTCOME_UNKNOWN item, and its sequel)", changed)
	if len(bad) > 0 {
		t.Fatalf("across the upgrade and rollback the router's outputs differ from the model in %d ways (seed %d; JSON report %s); first: %s",
			len(bad), seed, res.jsonPath, bad[0])
	}
}

// releaseChange reports whether a checker violation is a decision of the
// previous release that this release makes differently on purpose, rather
// than a record lost or duplicated: this release records a reviewer's
// decision on an OUTCOME_UNKNOWN item as the held write's reconciliation
// (its reason says so), and after an approval a receipt for the write
// (CONFIRMED or REJECTED) is the outcome of the write run again rather than
// the receipt of a held write, and after a rejection the write is held as
// RECONCILED rather than SUBMITTED.
func releaseChange(check, detail string) bool {
	if check != "audit.decision" && check != "review.decision" {
		return false
	}
	reconciled := strings.Contains(detail, "the OUTCOME_UNKNOWN item") &&
		(strings.Contains(detail, "(RECONCILED)") || strings.Contains(detail, "taken as not executed (PLANNED)"))
	// after an approval the write runs again: its receipt is that run's
	// outcome, no longer the receipt of a held write
	confirmed := strings.Contains(detail, "rule outcome_unknown.confirmed") && strings.Contains(detail, "want SUCCEEDED/COMPLETE rule succeeded.complete")
	rejected := strings.Contains(detail, "rule outcome_unknown.rejected") && strings.Contains(detail, "want BUSINESS_REJECTED/REVIEW rule business_rejected.operation_rejected")
	// after a rejection the write is held as RECONCILED, no longer as
	// SUBMITTED: a later receipt's reason names the state it was held in
	heldAs := false
	if m := reasonWant.FindStringSubmatch(detail); m != nil {
		heldAs = m[1] != m[2] && strings.ReplaceAll(m[1], "held as SUBMITTED", "held as RECONCILED") == m[2]
	}
	return reconciled || confirmed || rejected || heldAs
}

// reasonWant splits a checker's detail on a decision's reason into the
// router's reason and the model's.
var reasonWant = regexp.MustCompile(`reason "(.*)", want "(.*)"$`)
