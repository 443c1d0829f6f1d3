package integration

import (
	"os"
	"os/exec"
	"path/filepath"
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
			// a release stops a partition's restore at a changelog record it
			// cannot read, with this error: the previous release must have
			// read every state this build wrote
			for _, n := range []string{"a", "b"} {
				if logs := c.routers[n].logs.String(); strings.Contains(logs, "changelog record this build cannot read") {
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
	// the previous release orders latches by its writers' clocks: the latch
	// checks are off in a run that mixes it in (checkerConfig.previous)
	res := runChecker(t, checkerConfig{seed: seed, tasks: 12_000, duration: 25 * time.Second, binary: old, schedule: roll, previous: old})
	printSummary(os.Stdout, []checkerResult{res})
	total := 0
	for _, n := range res.rep.ViolationsByCheck {
		total += n
	}
	if total > 0 {
		first := ""
		if len(res.rep.Violations) > 0 {
			v := res.rep.Violations[0]
			first = v.Check + ": " + v.Task + ": " + v.Detail
		}
		t.Fatalf("across the upgrade and rollback the router's outputs differ from the model in %d ways %v (seed %d; JSON report %s); first: %s",
			total, res.rep.ViolationsByCheck, seed, res.jsonPath, first)
	}
}
