package policy

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// TestDefaultValid guards Default(): the docs/design.md defaults form a valid
// policy with the numbers of the classes table.
func TestDefaultValid(t *testing.T) {
	p := Default()
	if err := p.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"retry_budget", p.RetryBudget, int32(4)},
		{"network_timeout.max_retries", p.NetworkTimeout.MaxRetries, int32(2)},
		{"network_timeout delays", []int64{backoff(1000, 5000, 1), backoff(1000, 5000, 2), backoff(1000, 5000, 4)}, []int64{1000, 2000, 5000}},
		{"auth_failed.max_retries", p.AuthFailed.MaxRetries, int32(1)},
		{"auth_failed.delay_ms", p.AuthFailed.DelayMs, int64(0)},
		{"model_refusal.min_confidence", p.ModelRefusal.MinConfidence, 0.75},
		{"validation_fixable.max_retries", p.ValidationFixable.MaxRetries, int32(3)},
		{"rate_limited.default_delay_ms", p.RateLimited.DefaultDelayMs, int64(10_000)},
		{"rate_limited.window_ms", p.RateLimited.WindowMs, int64(60_000)},
		{"budget_exhausted.max_cost_usd", p.Budget.MaxCostUSD, 0.50},
		{"budget_exhausted.max_tokens", p.Budget.MaxTokens, int64(3000)},
		{"budget_exhausted.max_elapsed_ms", p.Budget.MaxElapsedMs, int64(30_000)},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestDefaultYAMLMatchesDefault guards the commented default file: parsing
// default-policy.yaml gives exactly Default(), so the file documents the
// real defaults.
func TestDefaultYAMLMatchesDefault(t *testing.T) {
	p, err := Parse(DefaultYAML())
	if err != nil {
		t.Fatalf("Parse(default-policy.yaml) = %v", err)
	}
	if want := Default(); !reflect.DeepEqual(p, want) {
		t.Errorf("default-policy.yaml differs from Default():\n got %+v\nwant %+v", p, want)
	}
}

// TestLoadExample guards the example policy file: it loads, the keys it sets
// override the defaults, and every other key keeps its default.
func TestLoadExample(t *testing.T) {
	b, err := os.ReadFile("testdata/example-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseFile("testdata/example-policy.yaml", b)
	if err != nil {
		t.Fatalf("ParseFile = %v", err)
	}
	d := Default()
	if p.RetryBudget != 2 || p.NetworkTimeout.MaxRetries != 1 || p.NetworkTimeout.BaseDelayMs != 500 {
		t.Errorf("overrides not applied: retry_budget %d, network_timeout %+v", p.RetryBudget, p.NetworkTimeout)
	}
	if p.NetworkTimeout.MaxDelayMs != d.NetworkTimeout.MaxDelayMs || p.Budget.MaxElapsedMs != d.Budget.MaxElapsedMs {
		t.Errorf("missing keys lost their defaults: %+v %+v", p.NetworkTimeout, p.Budget)
	}
	if p.Owners["security"].SLAMs != 900_000 || p.Owners["legal"].SLAMs != 14_400_000 || p.Owners["content_safety"] != d.Owners["content_safety"] {
		t.Errorf("owners did not merge by ID: %v", p.Owners)
	}
	if len(p.ModelRefusal.Phrases) != len(d.ModelRefusal.Phrases) || len(p.ModelRefusal.ExtraPhrases) != 2 {
		t.Errorf("extra_phrases should add to the built-in library: %d + %d", len(p.ModelRefusal.Phrases), len(p.ModelRefusal.ExtraPhrases))
	}
	if _, ok := p.phrases().match("抱歉，这个问题超出范围。"); !ok {
		t.Error("an extra phrase of the file does not match")
	}
	if _, ok := p.phrases().match("我无法回答"); !ok {
		t.Error("a built-in phrase no longer matches after extra_phrases")
	}
	if got := p.ValidationFixable.Ranges[1].SuggestedModel; got != "deepseek" || p.ValidationFixable.Owner != "legal" {
		t.Errorf("validation ranges/owner not applied: %q %q", got, p.ValidationFixable.Owner)
	}
}

// TestParseErrors guards the policy file contract: an unknown key or a bad
// value is one error naming the key path (and line) and what is allowed.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want []string // substrings of the message
	}{
		{"misspelled top-level key", "retry_budgett: 3\n",
			[]string{"line 1: retry_budgett: unknown key; allowed keys: auth_failed,", "retry_budget,"}},
		{"misspelled nested key", "network_timeout:\n  max_retires: 3\n",
			[]string{"line 2: network_timeout.max_retires: unknown key; allowed keys: base_delay_ms, codes, error_types, http_statuses, max_delay_ms, max_retries"}},
		{"unknown key in a range", "validation_fixable:\n  ranges:\n    - {name: a, from: 1, to: 2, route: RETRY, modle: x}\n",
			[]string{"validation_fixable.ranges[0].modle: unknown key; allowed keys: from, name, route, suggested_model, to"}},
		{"negative delay", "network_timeout:\n  base_delay_ms: -100\n",
			[]string{"line 2: network_timeout.base_delay_ms: must be >= 0, got -100"}},
		{"negative retries", "network_timeout:\n  max_retries: -1\n",
			[]string{"network_timeout.max_retries: must be >= 0, got -1"}},
		{"negative rate-limit delay", "rate_limited:\n  default_delay_ms: -1\n",
			[]string{"rate_limited.default_delay_ms: must be >= 0, got -1"}},
		{"wrong type", "auth_failed:\n  max_retries: two\n",
			[]string{"line 2: auth_failed.max_retries: want an integer, got \"two\""}},
		{"list expected", "network_timeout:\n  http_statuses: 504\n",
			[]string{"network_timeout.http_statuses: want a list"}},
		{"confidence out of range", "model_refusal:\n  min_confidence: 1.5\n",
			[]string{"model_refusal.min_confidence: must be between 0 and 1, got 1.5"}},
		{"unknown owner", "auth_failed:\n  owner: secops\n",
			[]string{"auth_failed.owner: must be one of the owners [ai_product content_safety operations product_operations security], got \"secops\""}},
		{"bad priority", "unclassified:\n  priority: urgent\n",
			[]string{"unclassified.priority: must be one of [high normal low], got \"urgent\""}},
		{"bad range route", "validation_fixable:\n  ranges:\n    - {name: a, from: 1, to: 2, route: DROP}\n",
			[]string{"validation_fixable.ranges[0].route: must be RETRY or REVIEW, got \"DROP\""}},
		{"overlapping ranges", "validation_fixable:\n  ranges:\n    - {name: a, from: 1000, to: 2000, route: RETRY}\n    - {name: b, from: 2000, to: 2999, route: REVIEW}\n",
			[]string{"validation_fixable.ranges[1]: range 2000-2999 overlaps ranges[0]"}},
		{"punctuation-only phrase", "model_refusal:\n  extra_phrases: [\"...!\"]\n",
			[]string{"model_refusal.extra_phrases[0]: must contain a letter or digit"}},
		{"bad stage", "business_rejected:\n  stages: [DOWNSTREAM]\n",
			[]string{"business_rejected.stages[0]: must be one of [NETWORK PROTOCOL MODEL BUSINESS], got \"DOWNSTREAM\""}},
		{"zero budget", "budget_exhausted:\n  max_cost_usd: 0\n",
			[]string{"budget_exhausted.max_cost_usd: must be > 0, got 0"}},
		{"message without placeholder", "review_loop:\n  user_messages: [\"Please try again.\"]\n",
			[]string{"review_loop.user_messages[0]: must contain the placeholder {reason}"}},
		{"not YAML", "retry_budget: [\n",
			[]string{"policy: not valid YAML"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Parse([]byte(c.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", p)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.HasPrefix(err.Error(), "policy: ") {
				t.Errorf("error %q lacks the policy: prefix", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\n  does not contain %q", err, w)
				}
			}
		})
	}
}

// TestParseFileNamesFile guards policy check's message: a bad file's error
// names the file, the line and the field.
func TestParseFileNamesFile(t *testing.T) {
	_, err := ParseFile("conf/bad.yaml", []byte("# header\nnetwork_timeout:\n  max_delay_ms: -5\n"))
	want := "policy: conf/bad.yaml:3: network_timeout.max_delay_ms: must be >= 0, got -5"
	if err == nil || err.Error() != want {
		t.Errorf("ParseFile = %v\nwant %s", err, want)
	}
}

// TestParsePartial guards "missing keys keep defaults": an empty file is the
// default policy, and setting one nested key changes only that key.
func TestParsePartial(t *testing.T) {
	for _, src := range []string{"", "# only a comment\n", "---\n"} {
		p, err := Parse([]byte(src))
		if err != nil || !reflect.DeepEqual(p, Default()) {
			t.Errorf("Parse(%q) = %v, want the default policy", src, err)
		}
	}
	p, err := Parse([]byte("rate_limited:\n  window_ms: 30000\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.RateLimited.WindowMs = 30_000
	if !reflect.DeepEqual(p, want) {
		t.Errorf("Parse changed more than rate_limited.window_ms")
	}
	if p.RateLimited.HTTPStatuses[0] != 429 {
		t.Errorf("inline keys lost their defaults: %+v", p.RateLimited)
	}
}

// TestValidateFieldError guards Validate's error type: a *FieldError with the
// path, usable with errors.As.
func TestValidateFieldError(t *testing.T) {
	p := Default()
	p.NetworkTimeout.MaxRetries = -1
	err := p.Validate()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "network_timeout.max_retries" {
		t.Fatalf("Validate = %v, want a FieldError for network_timeout.max_retries", err)
	}
	if got, want := err.Error(), "policy: network_timeout.max_retries: must be >= 0, got -1"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	p = Default()
	p.ValidationFixable.Ranges = append(p.ValidationFixable.Ranges, CodeRange{Name: "x", From: 5000, To: 5999, Route: event.RouteReview, SuggestedModel: "qwen"})
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "ranges[3].suggested_model") {
		t.Errorf("Validate = %v, want a suggested_model error on a REVIEW range", err)
	}
}
