package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Guards the checker itself: a deliberately broken router (built with the
// checkerfault tag: one due retry in 500 is published twice, see
// internal/router/retry_append_fault.go) fails the reference-model checker, and
// its report names the task whose retry came out twice, with that task's
// inputs and its expected and actual outputs. A checker that only counted
// records per topic, or that never looked at the retry topic, would pass it.
func TestCheckerCatchesBrokenRouter(t *testing.T) {
	broken := filepath.Join(t.TempDir(), "faultrouter-broken")
	build := exec.Command("go", "build", "-tags", "checkerfault", "-o", broken, "../cmd/faultrouter")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build the broken router: %v", err)
	}
	res := runChecker(t, checkerConfig{seed: checkerSeed(t), tasks: 2000, duration: 10 * time.Second, binary: broken, noSettle: true})
	printSummary(os.Stdout, []checkerResult{res})
	rep := res.rep
	if rep.OK() {
		t.Fatalf("the checker passed a router that publishes one due retry in 500 twice (report %s)", res.jsonPath)
	}
	if rep.ViolationsByCheck["retry.duplicate"] == 0 {
		t.Fatalf("the checker did not report the duplicated retry; violations by check: %v (report %s)", rep.ViolationsByCheck, res.jsonPath)
	}
	var task string
	for _, v := range rep.Violations {
		if v.Check == "retry.duplicate" {
			task = v.Task
			break
		}
	}
	if task == "" {
		t.Fatalf("no task named by the retry.duplicate violation")
	}
	if rep.FirstTask == nil || len(rep.FirstTask.Inputs) == 0 || len(rep.FirstTask.Expected) == 0 || len(rep.FirstTask.Actual) == 0 {
		t.Errorf("the report does not tell the first failing task's story (inputs, expected and actual outputs): %+v", rep.FirstTask)
	}
	b, err := os.ReadFile(res.jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"retry.duplicate"`) || !strings.Contains(string(b), task) {
		t.Errorf("the JSON report %s does not name the duplicated retry of task %s", res.jsonPath, task)
	}
	t.Logf("the broken router failed the checker: %d violations, %d of them retry.duplicate (first: task %s); JSON report %s",
		len(rep.Violations), rep.ViolationsByCheck["retry.duplicate"], task, res.jsonPath)
}
