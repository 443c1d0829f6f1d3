package policy

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// TestBreakersValidate guards the breakers section: a bad number is one
// *FieldError naming its full path.
func TestBreakersValidate(t *testing.T) {
	tests := []struct {
		path string
		mod  func(*Policy)
	}{
		{"breakers.provider_model.window_ms", func(p *Policy) { p.Breakers.ProviderModel.WindowMs = 0 }},
		{"breakers.provider_model.min_requests", func(p *Policy) { p.Breakers.ProviderModel.MinRequests = 0 }},
		{"breakers.downstream.failure_ratio", func(p *Policy) { p.Breakers.Downstream.FailureRatio = 1.01 }},
		{"breakers.prompt_template.failure_ratio", func(p *Policy) { p.Breakers.PromptTemplate.FailureRatio = 0 }},
		{"breakers.downstream.cooldown_ms", func(p *Policy) { p.Breakers.Downstream.CooldownMs = -5 }},
		{"breakers.prompt_template.half_open_probes", func(p *Policy) { p.Breakers.PromptTemplate.HalfOpenProbes = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			p := Default()
			tt.mod(p)
			var fe *FieldError
			if err := p.Validate(); !errors.As(err, &fe) || fe.Path != tt.path {
				t.Errorf("Validate() = %v, want a FieldError for %s", err, tt.path)
			}
		})
	}
}

// TestBreakersPartialOverride guards "a policy file sets only what it
// changes" for the breakers section.
func TestBreakersPartialOverride(t *testing.T) {
	p, err := Parse([]byte("breakers:\n  provider_model: {cooldown_ms: 2000, min_requests: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	pm := p.Breakers.ProviderModel
	if pm.CooldownMs != 2000 || pm.MinRequests != 3 || pm.WindowMs != d.Breakers.ProviderModel.WindowMs ||
		p.Breakers.Downstream != d.Breakers.Downstream {
		t.Errorf("breakers = %+v", p.Breakers)
	}
}

// TestBreakerOutcomes guards which decided events count for which breaker:
// provider/model failures outside the BUSINESS stage, downstream (action)
// failures at the BUSINESS stage, output failures per prompt template, a
// success for every breaker named, and classes that blame no breaker ignored.
func TestBreakerOutcomes(t *testing.T) {
	ev := func(stage event.Stage) *event.TaskEvent {
		return &event.TaskEvent{TaskID: "t1", Provider: "acme", Model: "m1", Action: "refund", PromptTemplate: "tpl", Stage: stage}
	}
	pm := "PROVIDER_MODEL/acme/m1"
	ds := "DOWNSTREAM/refund"
	tp := "PROMPT_TEMPLATE/tpl"
	tests := []struct {
		name  string
		ev    *event.TaskEvent
		class event.Class
		want  map[string]bool // ref -> failure
	}{
		{"success counts everywhere", ev(""), event.ClassSucceeded, map[string]bool{pm: false, ds: false, tp: false}},
		{"429 from the model", ev(event.StageModel), event.ClassRateLimited, map[string]bool{pm: true}},
		{"timeout at network", ev(event.StageNetwork), event.ClassNetworkTimeout, map[string]bool{pm: true}},
		{"timeout at the business system", ev(event.StageBusiness), event.ClassNetworkTimeout, map[string]bool{ds: true}},
		{"refusal blames model and template", ev(event.StageModel), event.ClassModelRefusal, map[string]bool{pm: true, tp: true}},
		{"validation code blames the template", ev(event.StageModel), event.ClassValidationFixable, map[string]bool{tp: true}},
		{"bad input blames nobody", ev(""), event.ClassInputQuality, map[string]bool{}},
		{"business no blames nobody", ev(event.StageBusiness), event.ClassBusinessRejected, map[string]bool{}},
		{"no provider, no provider breaker", &event.TaskEvent{TaskID: "t", Stage: event.StageModel}, event.ClassRateLimited, map[string]bool{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]bool{}
			for _, o := range BreakerOutcomes(tt.ev, tt.class) {
				got[o.Ref.String()] = o.Failure
				if o.TaskID != tt.ev.TaskID || o.Class != string(tt.class) {
					t.Errorf("outcome %+v lacks task or class", o)
				}
			}
			if len(got) != len(tt.want) {
				t.Fatalf("outcomes = %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if f, ok := got[k]; !ok || f != v {
					t.Errorf("outcomes = %v, want %v", got, tt.want)
				}
			}
		})
	}
	if s := (breaker.Ref{Scope: breaker.ProviderModel, Key: "acme/m1"}).String(); s != pm {
		t.Errorf("Ref.String() = %q", s)
	}
}

// BreakerKeys names the same breakers as BreakerRefs, builds a
// provider/model key once while it keeps it, and keeps a bounded number.
func TestBreakerKeysNameWhatBreakerRefsNames(t *testing.T) {
	var k BreakerKeys
	evs := []event.TaskEvent{
		{Provider: "acme", Model: "m1", Action: "refund", PromptTemplate: "t1"},
		{Provider: "acme", Model: "m1"},
		{Provider: "acme/x", Model: "m1"},
		{Provider: "acme", Model: ""},
		{Action: "ship"},
		{},
	}
	var scratch []breaker.Ref
	for range 3 {
		for i := range evs {
			scratch = k.AppendRefs(scratch[:0], &evs[i])
			if want := BreakerRefs(&evs[i]); !slices.Equal(scratch, want) {
				t.Fatalf("event %d: %v, want %v", i, scratch, want)
			}
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { scratch = k.AppendRefs(scratch[:0], &evs[0]) }); allocs != 0 {
		t.Fatalf("a key kept: %v allocations an event, want 0", allocs)
	}
	for i := range 2 * breakerKeysMax {
		ev := event.TaskEvent{Provider: "p", Model: fmt.Sprint(i)}
		if got := k.AppendRefs(nil, &ev); got[0].Key != "p/"+fmt.Sprint(i) {
			t.Fatalf("model %d: key %q", i, got[0].Key)
		}
		if len(k.keys) > breakerKeysMax {
			t.Fatalf("%d keys kept, at most %d", len(k.keys), breakerKeysMax)
		}
	}
}
