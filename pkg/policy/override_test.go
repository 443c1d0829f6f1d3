package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// overridesYAML holds overrides of every specificity, exact and prefix
// values; each changes network_timeout.max_retries to a number of its own,
// so that a decision shows which one decided.
const overridesYAML = `
overrides:
  - name: acme
    match: {provider: acme}
    network_timeout: {max_retries: 1}
  - name: acme-gpt4
    match: {provider: acme, model: "gpt-4*"}
    network_timeout: {max_retries: 3}
  - name: acme-gpt4o-refund
    match: {provider: acme, model: gpt-4o, action: refund, prompt_template: "*"}
    network_timeout: {max_retries: 0}
  - name: refund-v9
    match: {provider: other, prompt_template: refund-v9}
    network_timeout: {max_retries: 5}
`

func mustParse(t *testing.T, y string) *Policy {
	t.Helper()
	p, err := Parse([]byte(y))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func scopedTimeout(provider, model, action, template string) event.TaskEvent {
	return event.TaskEvent{EventID: "e-1", TaskID: "t-1", Attempt: 1, OccurredAt: event.FromMillis(1_800_000_000_000),
		Source: "w", Action: action, Provider: provider, Model: model, PromptTemplate: template,
		Stage: event.StageNetwork, Status: event.StatusError, Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}}
}

// TestOverrideMatch guards the choice of override: the most specific one
// matching the event's provider, model, action and prompt template decides
// (exact values, "*" and trailing-* prefixes), the decision names it, and an
// event no override matches is decided by the base policy, unnamed.
func TestOverrideMatch(t *testing.T) {
	p := mustParse(t, overridesYAML)
	cases := []struct {
		name                              string
		provider, model, action, template string
		want                              string
		retries                           int32 // network_timeout.max_retries that decided
	}{
		{"provider only", "acme", "claude", "summary", "s-1", "acme", 1},
		{"prefix beats provider alone", "acme", "gpt-4.1", "summary", "s-1", "acme-gpt4", 3},
		{"prefix matches the bare prefix", "acme", "gpt-4", "summary", "", "acme-gpt4", 3},
		{"three fields beat two", "acme", "gpt-4o", "refund", "refund-v9", "acme-gpt4o-refund", 0},
		{"two fields of another override", "other", "gpt-4o", "refund", "refund-v9", "refund-v9", 5},
		{"case matters", "ACME", "gpt-4o", "summary", "", "", 2},
		{"unknown provider is no provider", "", "gpt-4o", "refund", "", "", 2},
		{"no match", "openai", "gpt-4o", "refund", "refund-v8", "", 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev := scopedTimeout(c.provider, c.model, c.action, c.template)
			o, ok := p.OverrideFor(&ev)
			if ok != (c.want != "") || o.Name != c.want {
				t.Fatalf("OverrideFor = %q, %v; want %q", o.Name, ok, c.want)
			}
			// decide the event until it is no longer retried: the retries
			// made are the deciding override's max_retries (within the
			// shared budget of 4)
			var st task.State
			for n := int64(0); ; n++ {
				ev.EventID = "e-" + itoa(n)
				d := p.Decide(&ev, &st, ev.OccurredAt.Time)
				if d.Override != c.want {
					t.Fatalf("decision %d names override %q, want %q", n, d.Override, c.want)
				}
				if d.Route != event.RouteRetry {
					break
				}
			}
			if want := min(c.retries, p.RetryBudget); st.Retries != want {
				t.Errorf("%d retries, want %d", st.Retries, want)
			}
		})
	}
}

// TestOverrideInherits guards inheritance: an override's section keeps
// every key it does not give from the base (here a policy file's base, not
// only the defaults), and the sections it does not name are the base's.
func TestOverrideInherits(t *testing.T) {
	p := mustParse(t, `
network_timeout: {base_delay_ms: 700, max_delay_ms: 900}
model_refusal: {min_confidence: 0.8, owner: operations}
overrides:
  - name: acme
    match: {provider: acme}
    network_timeout: {max_retries: 1}
    model_refusal: {min_confidence: 0.6}
`)
	o := p.Overrides[0]
	nt, mr := o.NetworkTimeout, o.ModelRefusal
	switch {
	case nt.MaxRetries != 1 || nt.BaseDelayMs != 700 || nt.MaxDelayMs != 900 || len(nt.Codes) != len(p.NetworkTimeout.Codes):
		t.Errorf("network_timeout = %+v, want max_retries 1 and the base's delays and codes", *nt)
	case mr.MinConfidence != 0.6 || mr.Owner != "operations" || mr.Priority != PriorityNormal || len(mr.Phrases) != len(p.ModelRefusal.Phrases):
		t.Errorf("model_refusal = %+v, want min_confidence 0.6, owner operations and the base's phrases", *mr)
	case o.AuthFailed != nil:
		t.Errorf("auth_failed = %+v, want nil (the base's)", *o.AuthFailed)
	}
	if got := o.Sections(); strings.Join(got, ",") != "network_timeout,model_refusal" {
		t.Errorf("Sections() = %v", got)
	}

	conf := func(provider string, c float64) event.Decision {
		ev := scopedTimeout(provider, "m", "a", "p")
		ev.Status, ev.Stage, ev.Error = event.StatusOK, event.StageModel, nil
		ev.Output = &event.Output{Text: "done", Confidence: &c}
		return p.Explain(&ev, ev.OccurredAt.Time)
	}
	// 0.7 is a refusal under the base (0.8) but not under acme's 0.6
	if d := conf("acme", 0.7); d.Class != event.ClassSucceeded || d.Override != "acme" {
		t.Errorf("acme at 0.7: %s override %q, want SUCCEEDED override acme", d.Class, d.Override)
	}
	d := conf("acme", 0.5)
	if d.Class != event.ClassModelRefusal || d.Review == nil || d.Review.Owner != "operations" {
		t.Errorf("acme at 0.5: %s review %+v, want MODEL_REFUSAL to the base's owner operations", d.Class, d.Review)
	}
	if d := conf("other", 0.7); d.Class != event.ClassModelRefusal || d.Override != "" {
		t.Errorf("other at 0.7: %s override %q, want MODEL_REFUSAL by the base policy", d.Class, d.Override)
	}
	// the first retry's delay is the base's 700 ms under acme too
	ev := scopedTimeout("acme", "m", "a", "p")
	if d := p.Explain(&ev, ev.OccurredAt.Time); d.Retry == nil || d.Retry.DelayMs != 700 {
		t.Errorf("acme timeout: retry %+v, want a retry after the base's 700 ms", d.Retry)
	}
}

// TestOverrideSharedLimits guards what overrides leave alone: the shared
// retry budget counts the retries made under every override, and an
// override's owner keeps the base owner's SLA.
func TestOverrideSharedLimits(t *testing.T) {
	p := mustParse(t, `
retry_budget: 2
overrides:
  - name: patient
    match: {model: slow}
    network_timeout: {max_retries: 9}
    unclassified: {owner: security, priority: low}
`)
	ev := scopedTimeout("acme", "slow", "a", "p")
	var st task.State
	for n := range 3 {
		ev.EventID = "e-" + itoa(int64(n))
		d := p.Decide(&ev, &st, ev.OccurredAt.Time)
		if n == 2 && (d.Route != event.RouteDeadLetter || d.Rule != RuleRetryBudgetExhausted) {
			t.Fatalf("third timeout: %s %s, want DEADLETTER %s: the shared budget of 2 holds under the override", d.Route, d.Rule, RuleRetryBudgetExhausted)
		}
	}
	ev = scopedTimeout("acme", "slow", "a", "p")
	ev.Error = &event.Error{Code: "what_is_this"}
	d := p.Explain(&ev, ev.OccurredAt.Time)
	if d.Review == nil || *d.Review != (event.Review{Owner: "security", SLAMs: p.Owners["security"].SLAMs, Priority: "low"}) {
		t.Errorf("unclassified under the override: review %+v, want security's SLA, priority low", d.Review)
	}
}

// TestOverrideAmbiguous guards the tie rule: two overrides of equal
// specificity that can both match one event are one error naming both and
// an event they share; equal specificity with exclusive matches, or a more
// specific one, is fine.
func TestOverrideAmbiguous(t *testing.T) {
	two := func(a, b string) string {
		return "overrides:\n  - name: first\n    match: " + a + "\n    network_timeout: {max_retries: 1}\n" +
			"  - name: second\n    match: " + b + "\n    network_timeout: {max_retries: 0}\n"
	}
	ties := []struct{ name, a, b, shared string }{
		{"different fields", "{provider: acme}", "{model: gpt-4o}", "provider=acme model=gpt-4o"},
		{"same field and value", "{provider: acme}", "{provider: acme, model: '*'}", "provider=acme"},
		{"prefix and exact", `{model: "gpt-4*"}`, "{model: gpt-4o}", "model=gpt-4o"},
		{"nested prefixes", `{model: "gpt*"}`, `{model: "gpt-4*"}`, "model=gpt-4*"},
		{"two of four", "{provider: acme, action: refund}", "{model: m, prompt_template: t}", "provider=acme model=m action=refund prompt_template=t"},
	}
	for _, c := range ties {
		t.Run("tie/"+c.name, func(t *testing.T) {
			_, err := Parse([]byte(two(c.a, c.b)))
			fe, ok := errors.AsType[*FieldError](err)
			if !ok {
				t.Fatalf("Parse = %v, want a *FieldError", err)
			}
			msg := err.Error()
			for _, want := range []string{`"first"`, `"second"`, "ambiguous", "both match an event with " + c.shared + ","} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not say %q", msg, want)
				}
			}
			if fe.Path != "overrides[1]" || fe.Line != 5 {
				t.Errorf("error at %s line %d, want overrides[1] line 5", fe.Path, fe.Line)
			}
		})
	}
	fine := []struct{ name, a, b string }{
		{"exclusive values", "{provider: acme}", "{provider: other}"},
		{"exclusive prefixes", `{model: "gpt-4*"}`, `{model: "gpt-3*"}`},
		{"exclusive on one of two fields", "{provider: acme, model: a}", "{provider: other, action: b}"},
		{"more specific", "{provider: acme}", "{provider: acme, model: gpt-4o}"},
	}
	for _, c := range fine {
		t.Run("fine/"+c.name, func(t *testing.T) {
			if _, err := Parse([]byte(two(c.a, c.b))); err != nil {
				t.Fatalf("Parse = %v, want no error", err)
			}
		})
	}
}

// TestOverrideErrors guards the validation of overrides: each mistake is one
// error naming the field, its line and what is allowed.
func TestOverrideErrors(t *testing.T) {
	one := func(body string) string { return "overrides:\n  - " + strings.ReplaceAll(body, "\n", "\n    ") + "\n" }
	cases := []struct {
		name, file, path string
		want             []string
	}{
		{"no name", one("match: {model: m}\nnetwork_timeout: {max_retries: 1}"), "overrides[0].name", []string{"must be set"}},
		{"bad name", one("name: Acme Timeouts\nmatch: {model: m}\nnetwork_timeout: {max_retries: 1}"), "overrides[0].name", []string{"a-z, 0-9", `"Acme Timeouts"`}},
		{"duplicate name", one("name: a\nmatch: {model: m}\nnetwork_timeout: {max_retries: 1}") + one("name: a\nmatch: {model: n}\nnetwork_timeout: {max_retries: 1}")[len("overrides:\n"):],
			"overrides[1].name", []string{"overrides[0]", "unique"}},
		{"no match", one("name: a\nnetwork_timeout: {max_retries: 1}"), "overrides[0].match", []string{`other than "*"`}},
		{"all stars", one("name: a\nmatch: {provider: '*', model: '*'}\nnetwork_timeout: {max_retries: 1}"), "overrides[0].match", []string{`other than "*"`, "base policy"}},
		{"empty value", one("name: a\nmatch: {model: ''}\nnetwork_timeout: {max_retries: 1}"), "overrides[0].match.model", []string{"must not be empty"}},
		{"inner star", one("name: a\nmatch: {model: 'gpt-*-mini'}\nnetwork_timeout: {max_retries: 1}"), "overrides[0].match.model", []string{"prefix ending in", `"gpt-*-mini"`}},
		{"unknown match key", one("name: a\nmatch: {tenant: x}\nnetwork_timeout: {max_retries: 1}"), "overrides[0].match.tenant", []string{"allowed keys: action, model, prompt_template, provider"}},
		{"changes nothing", one("name: a\nmatch: {model: m}"), "overrides[0]", []string{"changes nothing", "network_timeout"}},
		{"retry budget", one("name: a\nmatch: {model: m}\nretry_budget: 9"), "overrides[0].retry_budget", []string{"not overridable", "shared retry budget"}},
		{"breakers of another key", one("name: a\nmatch: {provider: p, action: refund}\nbreakers: {provider_model: {min_requests: 5}}"), "overrides[0].breakers.provider_model",
			[]string{"keyed by provider and model alone", "action=refund", "(override a)"}},
		{"breakers of a template", one("name: a\nmatch: {model: m}\nbreakers: {prompt_template: {cooldown_ms: 5000}}"), "overrides[0].breakers.prompt_template",
			[]string{"keyed by prompt_template alone", "model=m"}},
		{"bad breaker value", one("name: a\nmatch: {action: refund}\nbreakers: {downstream: {failure_ratio: 2}}"), "overrides[0].breakers.downstream.failure_ratio",
			[]string{"(override a)"}},
		{"task budget", one("name: a\nmatch: {model: m}\nbudget_exhausted: {max_cost_usd: 2}"), "overrides[0].budget_exhausted", []string{"not overridable", "budget"}},
		{"unknown section key", one("name: a\nmatch: {model: m}\nnetwork_timeout: {retries: 1}"), "overrides[0].network_timeout.retries", []string{"unknown key", "max_retries"}},
		{"bad value", one("name: a\nmatch: {model: m}\nnetwork_timeout: {max_retries: -1}"), "overrides[0].network_timeout.max_retries", []string{"must be >= 0", "(override a)"}},
		{"unknown owner", one("name: a\nmatch: {model: m}\nmodel_refusal: {owner: nobody}"), "overrides[0].model_refusal.owner", []string{"must be one of the owners", `"nobody"`}},
		{"cross-key rule", one("name: a\nmatch: {model: m}\nnetwork_timeout: {base_delay_ms: 9000}"), "overrides[0].network_timeout.max_delay_ms", []string{"must be >= base_delay_ms (9000)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseFile("p.yaml", []byte(c.file))
			fe, ok := errors.AsType[*FieldError](err)
			if !ok {
				t.Fatalf("Parse = %v, want a *FieldError", err)
			}
			if !errors.Is(err, ErrInvalid) || fe.Path != c.path || fe.Line == 0 {
				t.Errorf("error %q: path %q line %d, want path %q and a line", err, fe.Path, fe.Line, c.path)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestOverrideGo guards overrides built in Go rather than read from a file:
// a section set in Go is used whole, Validate compiles the overrides, and
// the empty match value means any.
func TestOverrideGo(t *testing.T) {
	p := Default()
	nt := p.NetworkTimeout
	nt.MaxRetries = 0
	p.Overrides = []Override{{Name: "no-retry", Match: Match{Model: "m"}, NetworkTimeout: &nt}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	ev := scopedTimeout("any", "m", "any", "")
	if d := p.Explain(&ev, ev.OccurredAt.Time); d.Route != event.RouteDeadLetter || d.Override != "no-retry" {
		t.Errorf("decision %s override %q, want DEADLETTER by no-retry", d.Route, d.Override)
	}
	if s := p.Overrides[0].Match.String(); s != "model=m" {
		t.Errorf("Match.String() = %q", s)
	}
}

// TestResolveAllocatesNothing guards the hot path: choosing the override of
// an event allocates nothing, with overrides or without.
func TestResolveAllocatesNothing(t *testing.T) {
	with, without := mustParse(t, overridesYAML), Default()
	evs := []event.TaskEvent{scopedTimeout("acme", "gpt-4o", "refund", "x"), scopedTimeout("none", "m", "a", "p")}
	for _, p := range []*Policy{with, without} {
		for i := range evs {
			if n := testing.AllocsPerRun(100, func() { _ = p.resolve(&evs[i]) }); n != 0 {
				t.Errorf("resolve allocates %v times per event", n)
			}
		}
	}
}

// BenchmarkDecideOverrides is BenchmarkDecide's mix under a policy with four
// overrides, none matching the mix (so the decisions are the same): the
// cost of looking for one.
//
//	go test -run='^$' -bench=Decide -benchmem ./pkg/policy
func BenchmarkDecideOverrides(b *testing.B) {
	p, err := Parse([]byte(overridesYAML))
	if err != nil {
		b.Fatal(err)
	}
	benchmarkDecide(b, p)
}

// TestOverrideBreakerLimits guards an override's breakers section: the
// breaker of a key its match selects takes its limits (the base's for the
// keys the file does not give), the most specific override wins, and every
// other breaker keeps the base's.
func TestOverrideBreakerLimits(t *testing.T) {
	p, err := Parse([]byte(`overrides:
  - name: acme-breakers
    match: {provider: acme}
    breakers: {provider_model: {min_requests: 3, cooldown_ms: 5000}}
  - name: acme-big
    match: {provider: acme, model: "big*"}
    breakers: {provider_model: {min_requests: 50}}
  - name: refunds
    match: {action: refund}
    breakers: {downstream: {failure_ratio: 0.9}}
    network_timeout: {max_retries: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	base := Default().Breakers
	for _, c := range []struct {
		ref      breaker.Ref
		min      int32
		cooldown time.Duration
		ratio    float64
		by       string
	}{
		{breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/small"}, 3, 5 * time.Second, base.ProviderModel.FailureRatio, "acme-breakers"},
		{breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/big-2"}, 50, base.ProviderModel.Config().Cooldown, base.ProviderModel.FailureRatio, "acme-big"},
		{breaker.Ref{Scope: breaker.ProviderModel, Key: "other/big-2"}, base.ProviderModel.MinRequests, base.ProviderModel.Config().Cooldown, base.ProviderModel.FailureRatio, ""},
		{breaker.Ref{Scope: breaker.Downstream, Key: "refund"}, base.Downstream.MinRequests, base.Downstream.Config().Cooldown, 0.9, "refunds"},
		{breaker.Ref{Scope: breaker.Downstream, Key: "acme"}, base.Downstream.MinRequests, base.Downstream.Config().Cooldown, base.Downstream.FailureRatio, ""},
		{breaker.Ref{Scope: breaker.PromptTemplate, Key: "acme"}, base.PromptTemplate.MinRequests, base.PromptTemplate.Config().Cooldown, base.PromptTemplate.FailureRatio, ""},
	} {
		got, by := p.BreakerLimits(c.ref)
		if baseLimits, _ := Default().BreakerLimits(c.ref); got.MinRequests != c.min || got.Cooldown != c.cooldown ||
			got.FailureRatio != c.ratio || by != c.by || got.Window != baseLimits.Window {
			t.Errorf("%s: limits %+v of %q, want min_requests %d, cooldown %s, ratio %v of %q, the base's window",
				c.ref, got, by, c.min, c.cooldown, c.ratio, c.by)
		}
		f := p.BreakerLimitsFunc()
		if f == nil {
			t.Fatal("BreakerLimitsFunc is nil with overrides that set breaker limits")
		}
		if fc := f(c.ref); (fc == nil) != (c.by == "") || fc != nil && *fc != got {
			t.Errorf("%s: BreakerLimitsFunc gives %+v, want %+v", c.ref, fc, got)
		}
	}
	if Default().BreakerLimitsFunc() != nil {
		t.Error("BreakerLimitsFunc of the default policy is not nil")
	}
	// an override of breaker limits alone decides no event: an acme refund is
	// decided by refunds, which ties with acme-breakers on events only
	if o, ok := p.OverrideFor(&event.TaskEvent{Provider: "acme", Model: "small", Action: "refund"}); !ok || o.Name != "refunds" {
		t.Errorf("an acme refund is decided by %q (%v), want refunds", o.Name, ok)
	}
	if _, ok := p.OverrideFor(&event.TaskEvent{Provider: "acme", Model: "small", Action: "answer"}); ok {
		t.Error("an acme answer is decided by an override of breaker limits alone")
	}
	// two overrides setting one scope's limits for one key, as specific: a tie
	_, err = Parse([]byte(`overrides:
  - name: acme
    match: {provider: acme}
    breakers: {provider_model: {min_requests: 3}}
  - name: small
    match: {model: small}
    breakers: {provider_model: {min_requests: 4}}
`))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "overrides[1].breakers.provider_model" || !strings.Contains(fe.Msg, "ambiguous") {
		t.Errorf("two provider_model limits for acme/small: %v, want an ambiguity at overrides[1].breakers.provider_model", err)
	}
}
