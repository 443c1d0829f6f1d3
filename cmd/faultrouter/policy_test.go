package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// explainEvent builds one TaskEvent JSON line for the explain tests: sec is
// the second of occurred_at, extra the fields after usage.
func explainEvent(id, task string, sec int, cost float64, extra string) string {
	return fmt.Sprintf(`{"event_id":%q,"task_id":%q,"attempt":1,"occurred_at":"2026-03-01T11:00:%02dZ",`+
		`"source":"w","action":"refund","usage":{"cost_usd":%g,"tokens":10,"elapsed_ms":100}%s}`+"\n", id, task, sec, cost, extra)
}

// TestPolicyExplainEveryClass guards the classifier as a user sees it: `policy explain`
// on an event of each class prints the class docs/design.md names (classes that
// depend on history get the events before them on the same stdin).
func TestPolicyExplainEveryClass(t *testing.T) {
	const writeUnknown = `,"status":"ERROR","stage":"BUSINESS","error":{"type":"TimeoutError"},"operation":{"op_id":"op1","kind":"WRITE","params_sha256":"aa","state":"UNKNOWN"}`
	cases := []struct {
		class event.Class
		stdin string
	}{
		{event.ClassSucceeded, explainEvent("e1", "T", 0, 0.01, `,"status":"OK","output":{"text":"done","schema_valid":true,"confidence":0.9}`)},
		{event.ClassNetworkTimeout, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","stage":"NETWORK","error":{"type":"TimeoutError"}`)},
		{event.ClassAuthFailed, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","stage":"PROTOCOL","error":{"http_status":401}`)},
		{event.ClassInputQuality, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","stage":"PROTOCOL","error":{"http_status":400}`)},
		{event.ClassModelRefusal, explainEvent("e1", "T", 0, 0.01, `,"status":"OK","stage":"MODEL","output":{"text":"抱歉，我无法回答。"}`)},
		{event.ClassSchemaViolation, explainEvent("e1", "T", 0, 0.01, `,"status":"OK","stage":"MODEL","output":{"schema_valid":false}`)},
		{event.ClassValidationFixable, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","stage":"BUSINESS","error":{"code":"CODE_2101","message":"clause conflict"}`)},
		{event.ClassDuplicateExecution, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","stage":"BUSINESS","error":{"http_status":409}`)},
		{event.ClassBusinessRejected, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","stage":"BUSINESS","error":{"code":"insufficient_balance"}`)},
		{event.ClassHallucination, explainEvent("e1", "T", 0, 0.01, `,"status":"OK","stage":"MODEL","output":{"flags":["fabricated_data"]}`)},
		{event.ClassRateLimited, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","error":{"http_status":429}`)},
		{event.ClassRateLimitExceeded, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","error":{"http_status":429}`) +
			explainEvent("e2", "T", 59, 0.01, `,"status":"ERROR","error":{"http_status":429}`)},
		{event.ClassBudgetExhausted, explainEvent("e1", "T", 0, 0.50, `,"status":"ERROR","stage":"NETWORK","error":{"type":"TimeoutError"}`)},
		{event.ClassOutcomeUnknown, explainEvent("e1", "T", 0, 0.01, writeUnknown)},
		{event.ClassParamsMismatch, explainEvent("e1", "T", 0, 0.01, writeUnknown) +
			explainEvent("e2", "T", 30, 0.01, `,"status":"OK","stage":"BUSINESS","operation":{"op_id":"op1","kind":"WRITE","params_sha256":"bb","state":"SUBMITTED"}`)},
		{event.ClassUnclassified, explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","error":{"http_status":500}`)},
	}
	for _, c := range cases {
		t.Run(string(c.class), func(t *testing.T) {
			var out bytes.Buffer
			if err := policyCommand([]string{"explain"}, strings.NewReader(c.stdin), &out, &out); err != nil {
				t.Fatalf("explain: %v", err)
			}
			blocks := strings.Split(strings.TrimSpace(out.String()), "\n\n")
			last := blocks[len(blocks)-1]
			fields := map[string]string{}
			for _, l := range strings.Split(last, "\n") {
				name, value, _ := strings.Cut(l, ":")
				fields[name] = strings.TrimSpace(value)
			}
			if fields["class"] != string(c.class) {
				t.Errorf("last decision prints class %q, want %s:\n%s", fields["class"], c.class, last)
			}
			for _, name := range []string{"rule", "route", "reason", "retry", "review", "totals"} {
				if fields[name] == "" {
					t.Errorf("output lacks %q:\n%s", name, last)
				}
			}
		})
	}
}

// TestPolicyExplainJSON guards --format json and --policy: one Decision
// object a line, decided with the given policy file.
func TestPolicyExplainJSON(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte("network_timeout:\n  base_delay_ms: 250\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	in := explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","error":{"type":"TimeoutError"}`) +
		explainEvent("e1", "T", 0, 0.01, `,"status":"ERROR","error":{"type":"TimeoutError"}`)
	var out bytes.Buffer
	if err := policyCommand([]string{"explain", "--policy", file, "--format", "json"}, strings.NewReader(in), &out, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 JSON lines, got:\n%s", out.String())
	}
	var first, second event.Decision
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	if first.Class != event.ClassNetworkTimeout || first.Retry == nil || first.Retry.DelayMs != 250 {
		t.Errorf("first decision %+v, want NETWORK_TIMEOUT retry after 250 ms", first)
	}
	if second.Route != event.RouteDrop {
		t.Errorf("the redelivered event was not dropped: %+v", second)
	}
}

// TestPolicyCheck guards `policy check`: a good file prints ok, a misspelled
// key and a negative delay are one clear error naming file, line and field.
func TestPolicyCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "retry_budget: 3\n")
	var out bytes.Buffer
	if err := policyCommand([]string{"check", good}, nil, &out, &out); err != nil || out.String() != "ok: "+good+"\n" {
		t.Errorf("check good = %v, %q", err, out.String())
	}
	example := filepath.Join("..", "..", "pkg", "policy", "testdata", "example-policy.yaml")
	if err := policyCommand([]string{"check", example}, nil, &out, &out); err != nil {
		t.Errorf("check example = %v", err)
	}

	cases := []struct{ name, body, want string }{
		{"misspelled.yaml", "rate_limited:\n  defualt_delay_ms: 5000\n",
			":2: rate_limited.defualt_delay_ms: unknown key; allowed keys: codes, default_delay_ms, error_types, http_statuses, max_retry_after_ms, window_ms"},
		{"negative.yaml", "network_timeout:\n  base_delay_ms: -1000\n",
			":2: network_timeout.base_delay_ms: must be >= 0, got -1000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := write(c.name, c.body)
			out.Reset()
			err := policyCommand([]string{"check", path}, nil, &out, &out)
			if err == nil {
				t.Fatalf("check %s succeeded: %q", c.name, out.String())
			}
			if want := "policy: " + path + c.want; err.Error() != want {
				t.Errorf("error %q\nwant  %q", err, want)
			}
			if out.Len() != 0 {
				t.Errorf("check printed %q on failure", out.String())
			}
		})
	}
}

// TestPolicyUsageErrors guards the verb's argument handling: missing or
// unknown subcommands, missing files and bad events are errors, not panics.
func TestPolicyUsageErrors(t *testing.T) {
	cases := []struct {
		args  []string
		stdin string
		want  string
	}{
		{nil, "", "missing subcommand"},
		{[]string{"lint"}, "", `unknown subcommand "lint"`},
		{[]string{"check"}, "", "want exactly one FILE"},
		{[]string{"check", "no-such-policy.yaml"}, "", "policy: open no-such-policy.yaml: no such file"},
		{[]string{"explain", "--format", "xml"}, "", "--format must be text or json"},
		{[]string{"explain"}, "", "no event on stdin"},
		{[]string{"explain"}, `{"event_id":"e1"}`, "event 1: field task_id"},
		{[]string{"explain"}, `{"event_id":"e1","task_id":"T","attempt":1,"occurred_at":"2026-03-01T11:00:00Z","status":"OK","colour":"red"}`, "event 1: field colour: unknown field"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		err := policyCommand(c.args, strings.NewReader(c.stdin), &out, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("policy %v: error %v, want %q", c.args, err, c.want)
		}
	}
	var out bytes.Buffer
	if err := policyCommand([]string{"default"}, nil, &out, &out); err != nil || !strings.Contains(out.String(), "retry_budget: 4") {
		t.Errorf("policy default = %v, %q", err, out.String())
	}
}
