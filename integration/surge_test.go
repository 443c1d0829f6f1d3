package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// surgePolicy alerts on a class that is >= half of a key's events, from 5
// events of it on.
const surgePolicy = `surge:
  min_events: 5
  ratio: 0.5
`

// surgeEvent is a taskEvent for prompt template tpl, answered by acme/m1 when
// acme is set (else openai/gpt-4o).
func surgeEvent(eventID, taskID, tpl string, acme bool, fields string) string {
	line := taskEvent(eventID, taskID, 1, fields)
	if acme {
		line = acmeEvent(eventID, taskID, 1, fields)
	}
	return strings.Replace(line, `"prompt_template":"support-v3"`, `"prompt_template":"`+tpl+`"`, 1)
}

// surgeAlerts are the surge ALERT records of alerts (the template and
// provider breakers write TRANSITION records, other alerts say no "surge").
func surgeAlerts(alerts []map[string]any) []map[string]any {
	var out []map[string]any
	for _, a := range alerts {
		if str(a, "kind") == "ALERT" && strings.Contains(str(a, "reason"), "surge") {
			out = append(out, a)
		}
	}
	return out
}

// Guards the surge alerts end to end on the real broker: a burst of
// MODEL_REFUSAL for one prompt template (tpl-new, on acme/m1) raises exactly
// one ALERT naming the template with the numbers, and one naming its
// provider/model, each triggered by a refusing task; a template and a model
// with only successes (tpl-old on openai/gpt-4o) raise none; the alerts are
// counted in faultrouter_alerts_total.
func TestSurgeAlertNamesTemplate(t *testing.T) {
	e := newEnv(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte(surgePolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.startRouter("a", t.TempDir(), "--policy", pol)

	// 6 successes for tpl-old; 3 successes then 6 refusals for tpl-new, each
	// on its own task. The tasks spread over partitions, so the router sees
	// them in any order; once all are in, refusals are 6 of 9 for tpl-new and
	// acme/m1, and after the surge fires the ratio cannot fall below 0.5
	// again, whatever the order: one surge, one alert.
	var in strings.Builder
	refusing := map[string]bool{}
	for i := range 6 {
		in.WriteString(surgeEvent(fmt.Sprintf("old-%d", i), fmt.Sprintf("s-old-%d", i), "tpl-old", false, okFields))
	}
	for i := range 3 {
		in.WriteString(surgeEvent(fmt.Sprintf("new-ok-%d", i), fmt.Sprintf("s-new-ok-%d", i), "tpl-new", true, okFields))
	}
	for i := range 6 {
		id := fmt.Sprintf("s-new-ref-%d", i)
		refusing[id] = true
		in.WriteString(surgeEvent(fmt.Sprintf("new-ref-%d", i), id, "tpl-new", true, refusalFields))
	}
	e.cli(in.String(), "produce", "--topic", "ingress")

	// every event decided before the alerts are counted
	audit := e.tailUntil("audit", 60*time.Second, func(a []map[string]any) bool { return len(a) >= 15 })
	if len(audit) != 15 {
		t.Fatalf("%d audit records, want 15\nrouter logs:\n%s", len(audit), r.logs.String())
	}
	for _, a := range audit {
		if id := str(a, "task_id"); refusing[id] && str(a, "decision.class") != "MODEL_REFUSAL" {
			t.Fatalf("task %s decided %s, want MODEL_REFUSAL", id, str(a, "decision.class"))
		}
	}
	e.tailUntil("alerts", 30*time.Second, func(a []map[string]any) bool { return len(surgeAlerts(a)) >= 2 })
	time.Sleep(time.Second) // a second alert per key would be there by now
	surges := surgeAlerts(e.tail("alerts", 2*time.Second))

	byKey := map[string][]map[string]any{}
	for _, a := range surges {
		byKey[str(a, "scope")+"/"+str(a, "key")] = append(byKey[str(a, "scope")+"/"+str(a, "key")], a)
	}
	// exactly these two: none for tpl-old or openai/gpt-4o (only successes)
	if len(surges) != 2 || len(byKey["PROMPT_TEMPLATE/tpl-new"]) != 1 || len(byKey["PROVIDER_MODEL/acme/m1"]) != 1 {
		t.Fatalf("want one surge ALERT for PROMPT_TEMPLATE/tpl-new and one for PROVIDER_MODEL/acme/m1, got %v\nrouter logs:\n%s",
			surges, r.logs.String())
	}
	for _, c := range []struct{ key, noun, name string }{
		{"PROMPT_TEMPLATE/tpl-new", "prompt template", "tpl-new"},
		{"PROVIDER_MODEL/acme/m1", "model", "acme/m1"},
	} {
		a := byKey[c.key][0]
		if str(a, "class") != "MODEL_REFUSAL" || !refusing[str(a, "task_id")] || str(a, "instance") != "a" {
			t.Errorf("%s: alert %v, want class MODEL_REFUSAL, a refusing task, instance a", c.key, a)
		}
		re := regexp.MustCompile(`^surge: (\d+) of (\d+) events for ` + c.noun + ` ` + regexp.QuoteMeta(c.name) +
			` in the last 5m are MODEL_REFUSAL \(ratio (\d\.\d\d) >= 0\.50\)$`)
		m := re.FindStringSubmatch(str(a, "reason"))
		if m == nil {
			t.Errorf("%s: reason %q does not match %s", c.key, str(a, "reason"), re)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		total, _ := strconv.Atoi(m[2])
		if n < 5 || n > 6 || total < n || total > 9 || 2*n < total || get(a, "failures") != float64(n) || get(a, "requests") != float64(total) {
			t.Errorf("%s: %d of %d (failures %v, requests %v): want 5-6 refusals, at least half of at most 9 events",
				c.key, n, total, get(a, "failures"), get(a, "requests"))
		}
	}
	if got, ok := scrape(t, r.metrics, `faultrouter_alerts_total{class="MODEL_REFUSAL"}`); !ok || got != 2 {
		t.Errorf(`/metrics faultrouter_alerts_total{class="MODEL_REFUSAL"} = %v (present %v), want 2`, got, ok)
	}
}
