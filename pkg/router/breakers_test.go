package router

import (
	"testing"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

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
			for _, o := range outcomes(tt.ev, tt.class) {
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
