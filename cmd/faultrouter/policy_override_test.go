package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

const overridePolicy = `overrides:
  - name: acme-timeouts
    match:
      provider: acme
      model: "*"
      action: "*"
      prompt_template: "*"
    network_timeout: {max_retries: 1}
    model_refusal: {min_confidence: 0.6}
  - name: acme-mini
    match: {provider: acme, model: "gpt-4o-mini*"}
    network_timeout: {max_retries: 0}
`

func writePolicy(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPolicyCheckOverrides guards `policy check` on overrides: the file of
// the agreed format is ok, and two equally specific overrides that can match
// one event are one error naming the file, the line, both overrides and an
// event they share.
func TestPolicyCheckOverrides(t *testing.T) {
	good := writePolicy(t, overridePolicy)
	var out bytes.Buffer
	if err := policyCommand([]string{"check", good}, nil, &out, &out); err != nil || out.String() != "ok: "+good+"\n" {
		t.Fatalf("check = %v, %q", err, out.String())
	}

	bad := writePolicy(t, overridePolicy+`  - name: gpt4o-everywhere
    match: {model: gpt-4o-mini}
    network_timeout: {max_retries: 3}
`)
	out.Reset()
	err := policyCommand([]string{"check", bad}, nil, &out, &out)
	want := "policy: " + bad + `:13: overrides[2]: override "gpt4o-everywhere" and override "acme-timeouts" (overrides[0]) are ambiguous: ` +
		"both match an event with provider=acme model=gpt-4o-mini, and both are as specific (1 of provider, model, action, prompt_template set); " +
		"make one more specific or make their matches exclusive"
	if err == nil || err.Error() != want {
		t.Errorf("check error\n%v\nwant\n%s", err, want)
	}
	if out.Len() != 0 {
		t.Errorf("check printed %q on failure", out.String())
	}
}

// TestPolicyExplainNamesOverride guards `policy explain` under overrides: the
// text names the override that decided, its match and what it changes, or
// says that none matched; JSON carries the name; and the decision follows the
// override (acme's timeouts retry once, acme-mini's never, others twice).
func TestPolicyExplainNamesOverride(t *testing.T) {
	file := writePolicy(t, overridePolicy)
	timeout := `,"status":"ERROR","stage":"NETWORK","error":{"type":"TimeoutError"}`
	ev := func(id, provider, model string) string {
		return explainEvent(id, id, 0, 0.01, `,"provider":"`+provider+`","model":"`+model+`"`+timeout)
	}
	in := ev("a", "acme", "gpt-4o") + ev("b", "acme", "gpt-4o-mini-2") + ev("c", "openai", "gpt-4o-mini")

	var out bytes.Buffer
	if err := policyCommand([]string{"explain", "--policy", file}, strings.NewReader(in), &out, &out); err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(strings.TrimSpace(out.String()), "\n\n")
	if len(blocks) != 3 {
		t.Fatalf("want 3 decisions, got:\n%s", out.String())
	}
	wants := []struct{ override, route string }{
		{"acme-timeouts (match provider=acme; changes network_timeout, model_refusal)", "RETRY"},
		{"acme-mini (match provider=acme model=gpt-4o-mini*; changes network_timeout)", "DEADLETTER"},
		{`none: no override matches provider openai, model gpt-4o-mini, action refund, prompt template ""; the base policy decided`, "RETRY"},
	}
	for i, w := range wants {
		fields := map[string]string{}
		for _, l := range strings.Split(blocks[i], "\n") {
			name, value, _ := strings.Cut(l, ":")
			fields[name] = strings.TrimSpace(value)
		}
		if fields["override"] != w.override || fields["route"] != w.route {
			t.Errorf("decision %d: override %q route %s, want %q %s:\n%s", i, fields["override"], fields["route"], w.override, w.route, blocks[i])
		}
	}

	out.Reset()
	if err := policyCommand([]string{"explain", "--policy", file, "--format", "json"}, strings.NewReader(in), &out, &out); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var d event.Decision
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatal(err)
		}
		names = append(names, d.Override)
	}
	if strings.Join(names, ",") != "acme-timeouts,acme-mini," {
		t.Errorf("JSON overrides %q, want acme-timeouts, acme-mini and none", names)
	}

	// without overrides the text has no override line
	out.Reset()
	if err := policyCommand([]string{"explain"}, strings.NewReader(ev("a", "acme", "gpt-4o")), &out, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "override:") {
		t.Errorf("the default policy's explanation names an override:\n%s", out.String())
	}
}
