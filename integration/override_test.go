package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// overridePolicyYAML overrides the policy for one model: its timeouts are
// never retried and its outputs pass at confidence 0.6.
const overridePolicyYAML = `overrides:
  - name: mini-no-retry
    match: {provider: openai, model: gpt-4o-mini}
    network_timeout: {max_retries: 0}
    model_refusal: {min_confidence: 0.6}
`

// Guards policy overrides end to end on the real broker: a router running a
// policy with an override for one model routes that model's events by the
// override (a timeout dead-lettered at once, an output at confidence 0.7
// completed) and names it on their audit and routed records, while the same
// events of another model follow the base policy (a retry, a refusal to
// review) and name no override; the checker, modelling the same policy file,
// finds the outputs exact.
func TestOverrideRoutesOneModel(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(overridePolicyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.ParseFile(path, []byte(overridePolicyYAML))
	if err != nil {
		t.Fatal(err)
	}
	r := e.startRouter("a", t.TempDir(), "--policy", path)

	mini := func(line string) string {
		return strings.Replace(line, `"model":"gpt-4o"`, `"model":"gpt-4o-mini"`, 1)
	}
	unsure := `"status":"OK","stage":"MODEL","output":{"text":"Your refund was issued.","schema_valid":true,"confidence":0.7}`
	e.cli(mini(taskEvent("m-net", "t-mini-net", 1, timeoutFields))+taskEvent("b-net", "t-base-net", 1, timeoutFields)+
		mini(taskEvent("m-conf", "t-mini-conf", 1, unsure))+taskEvent("b-conf", "t-base-conf", 1, unsure),
		"produce", "--topic", "ingress")

	audit := e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(r) >= 4 })
	if len(audit) != 4 {
		t.Fatalf("audit has %d records, want 4 (one per input): %v", len(audit), audit)
	}
	want := map[string]struct{ decision, override string }{
		"t-mini-net":  {"NETWORK_TIMEOUT/DEADLETTER/network_timeout.exhausted", "mini-no-retry"},
		"t-mini-conf": {"SUCCEEDED/COMPLETE/succeeded.complete", "mini-no-retry"},
		"t-base-net":  {"NETWORK_TIMEOUT/RETRY/network_timeout.retry", ""},
		"t-base-conf": {"MODEL_REFUSAL/REVIEW/model_refusal.low_confidence", ""},
	}
	for task, w := range want {
		recs := byTask(audit, task)
		if len(recs) != 1 {
			t.Fatalf("%s: %d audit records, want 1", task, len(recs))
		}
		r := recs[0]
		got := str(r, "decision.class") + "/" + str(r, "decision.route") + "/" + str(r, "decision.rule")
		if got != w.decision || str(r, "decision.override") != w.override {
			t.Errorf("%s: audited %s under override %q, want %s under %q (reason %q)", task, got, str(r, "decision.override"), w.decision, w.override, str(r, "decision.reason"))
		}
	}

	// the routed records carry the decision as audited
	dl := e.tailUntil("deadletter", 30*time.Second, func(r []map[string]any) bool { return len(r) >= 1 })
	if len(dl) != 1 || str(dl[0], "task_id") != "t-mini-net" || str(dl[0], "decision.override") != "mini-no-retry" {
		t.Errorf("deadletter: want t-mini-net's timeout under mini-no-retry, got %v", dl)
	}
	retries := e.tailUntil("retry", 30*time.Second, func(r []map[string]any) bool { return len(r) >= 1 })
	if len(retries) != 1 || str(retries[0], "task_id") != "t-base-net" || str(retries[0], "decision.override") != "" {
		t.Errorf("retry: want t-base-net's retry under the base policy, got %v", retries)
	}

	// the router's line for the decision names the override too
	for _, l := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(l, "t-mini-net") && strings.Contains(l, "routed") && !strings.Contains(l, "override=mini-no-retry") {
			t.Errorf("the log line of t-mini-net's decision does not name the override: %s", l)
		}
		if strings.Contains(l, "t-base-net") && strings.Contains(l, "override=") {
			t.Errorf("the log line of t-base-net's decision names an override: %s", l)
		}
	}
	if !strings.Contains(r.logs.String(), "override=mini-no-retry") {
		t.Errorf("no log line names the override:\n%s", r.logs.String())
	}

	// the reference model of the same policy agrees with every output
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := func(short string) string { return e.prefix + "ai.tasks." + short }
	logs := checker.Logs{
		Ingress:    readTopic(ctx, t, topic("ingress"), true),
		Decisions:  readTopic(ctx, t, topic("review.decisions"), true),
		Audit:      readTopic(ctx, t, topic("audit"), true),
		Retry:      readTopic(ctx, t, topic("retry"), true),
		Review:     readTopic(ctx, t, topic("review"), true),
		DeadLetter: readTopic(ctx, t, topic("deadletter"), true),
		Alerts:     readTopic(ctx, t, topic("alerts"), true),
		End:        time.Now(),
	}
	rep, err := checker.Check(logs, checker.Options{Policy: pol, Ingress: topic("ingress"), Decisions: topic("review.decisions"), Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Decisions != 4 {
		t.Errorf("the checker modelled %d decisions, want the 4 inputs'", rep.Decisions)
	}
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Errorf("the checker finds the outputs differ from the policy's model:\n%s", s.String())
	}
}
