package policy

// breakers.go: which breakers a decided event speaks for, and whether it
// counts as a failure or a success of each. Pure: the router feeds the
// outcomes into its breaker set.

import (
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Which classes count as a failure of each breaker scope. SUCCEEDED counts as
// a success of every scope the event names; other classes are not counted (a
// bad input or a business "no" says nothing about the provider).
var (
	// providerFailures: the provider/model layer failed (any stage but
	// BUSINESS) or the model's output is unusable.
	providerFailures = classSet(event.ClassNetworkTimeout, event.ClassRateLimited, event.ClassRateLimitExceeded,
		event.ClassAuthFailed, event.ClassModelRefusal, event.ClassHallucination, event.ClassSchemaViolation)
	// downstreamFailures: the business system (stage BUSINESS) did not answer.
	downstreamFailures = classSet(event.ClassNetworkTimeout, event.ClassRateLimited, event.ClassRateLimitExceeded,
		event.ClassAuthFailed, event.ClassUnclassified)
	// templateFailures: the output of the prompt is unusable.
	templateFailures = classSet(event.ClassModelRefusal, event.ClassHallucination, event.ClassSchemaViolation,
		event.ClassValidationFixable)
)

func classSet(cs ...event.Class) map[event.Class]bool {
	m := make(map[event.Class]bool, len(cs))
	for _, c := range cs {
		m[c] = true
	}
	return m
}

// BreakerFailure reports whether an event of class at stage counts as a
// failure of a breaker of scope sc.
func BreakerFailure(sc breaker.Scope, stage event.Stage, class event.Class) bool {
	switch sc {
	case breaker.ProviderModel:
		return stage != event.StageBusiness && providerFailures[class]
	case breaker.Downstream:
		return stage == event.StageBusiness && downstreamFailures[class]
	case breaker.PromptTemplate:
		return templateFailures[class]
	}
	return false
}

// BreakerRefs are the breakers an event names: the ones its retry would be
// published into (provider/model, downstream action, prompt template).
func BreakerRefs(ev *event.TaskEvent) []breaker.Ref {
	return AppendBreakerRefs(make([]breaker.Ref, 0, 3), ev)
}

// AppendBreakerRefs appends BreakerRefs(ev) to dst.
func AppendBreakerRefs(dst []breaker.Ref, ev *event.TaskEvent) []breaker.Ref {
	return (*BreakerKeys)(nil).AppendRefs(dst, ev)
}

// BreakerKeys appends the breakers an event names as AppendBreakerRefs does,
// without building the provider/model key of each event anew: it keeps the
// keys it has built (up to breakerKeysMax, then it starts over). A router
// names these breakers for every event it decides, and most events share a
// few models. Not safe for concurrent use; a nil *BreakerKeys keeps none.
type BreakerKeys struct {
	buf  []byte
	keys map[string]string
}

const breakerKeysMax = 4096

// AppendRefs appends BreakerRefs(ev) to dst.
func (k *BreakerKeys) AppendRefs(dst []breaker.Ref, ev *event.TaskEvent) []breaker.Ref {
	if ev.Provider != "" && ev.Model != "" {
		dst = append(dst, breaker.Ref{Scope: breaker.ProviderModel, Key: k.providerModel(ev.Provider, ev.Model)})
	}
	if ev.Action != "" {
		dst = append(dst, breaker.Ref{Scope: breaker.Downstream, Key: ev.Action})
	}
	if ev.PromptTemplate != "" {
		dst = append(dst, breaker.Ref{Scope: breaker.PromptTemplate, Key: ev.PromptTemplate})
	}
	return dst
}

// providerModel is provider + "/" + model.
func (k *BreakerKeys) providerModel(provider, model string) string {
	if k == nil {
		return provider + "/" + model
	}
	k.buf = append(append(append(k.buf[:0], provider...), '/'), model...)
	if key, ok := k.keys[string(k.buf)]; ok {
		return key
	}
	if k.keys == nil || len(k.keys) >= breakerKeysMax {
		k.keys = make(map[string]string)
	}
	key := string(k.buf)
	k.keys[key] = key
	return key
}

// BreakerOutcomes are what one decided event tells each breaker it names: a
// success, a failure, or nothing.
func BreakerOutcomes(ev *event.TaskEvent, class event.Class) []breaker.Outcome {
	var out []breaker.Outcome
	for _, ref := range BreakerRefs(ev) {
		if o, ok := BreakerOutcome(ref, ev, class); ok {
			out = append(out, o)
		}
	}
	return out
}

// BreakerOutcome is what a decided event tells ref, one of the breakers it
// names (BreakerRefs); false when it tells nothing.
func BreakerOutcome(ref breaker.Ref, ev *event.TaskEvent, class event.Class) (breaker.Outcome, bool) {
	var failure bool
	switch {
	case class == event.ClassSucceeded:
	case BreakerFailure(ref.Scope, ev.Stage, class):
		failure = true
	default:
		return breaker.Outcome{}, false
	}
	return breaker.Outcome{Ref: ref, Failure: failure, Class: string(class), TaskID: ev.TaskID}, true
}

// LatchesTemplate reports whether a decided event latches its prompt
// template's breaker open until a person resets it (a hallucination), and
// which breaker that is.
func LatchesTemplate(ev *event.TaskEvent, class event.Class) (breaker.Ref, bool) {
	if class != event.ClassHallucination || ev.PromptTemplate == "" {
		return breaker.Ref{}, false
	}
	return breaker.Ref{Scope: breaker.PromptTemplate, Key: ev.PromptTemplate}, true
}

// ReviewResetsTemplate reports whether a person's decision on a review item
// closes the prompt template breaker its hallucination latched (approved or
// rejected alike: that is the person's reset), and which breaker that is.
// last is the task's last event; d the decision routed for the review.
func ReviewResetsTemplate(d *event.Decision, last *event.TaskEvent) (breaker.Ref, bool) {
	if d.Class != event.ClassHallucination || d.Route == event.RouteDrop || last == nil || last.PromptTemplate == "" {
		return breaker.Ref{}, false
	}
	return breaker.Ref{Scope: breaker.PromptTemplate, Key: last.PromptTemplate}, true
}

// HoldsLatchItem reports whether a task's state still has the open review
// item of a hallucination: while it does, the item keeps its template
// latched. An item that a re-drive cleared (task.State.Reopen) no longer
// holds it; a decision by a person closes it too (ReviewResetsTemplate).
func HoldsLatchItem(st *task.State) bool {
	return st != nil && st.Review == task.ReviewOpen && st.ReviewClass == event.ClassHallucination
}

// Config is the breaker.Config of these settings, for the router, the
// checker and `policy whatif` alike.
func (b Breaker) Config() breaker.Config {
	return breaker.Config{
		Window:         time.Duration(b.WindowMs) * time.Millisecond,
		MinRequests:    b.MinRequests,
		FailureRatio:   b.FailureRatio,
		Cooldown:       time.Duration(b.CooldownMs) * time.Millisecond,
		HalfOpenProbes: b.HalfOpenProbes,
	}
}

// Config is the breaker.SurgeConfig of these settings; an unknown scope is
// an error (Validate rejects it first).
func (s Surge) Config() (breaker.SurgeConfig, error) {
	cfg := breaker.SurgeConfig{Window: time.Duration(s.WindowMs) * time.Millisecond, MinEvents: s.MinEvents, Ratio: s.Ratio}
	for _, c := range s.Classes {
		cfg.Classes = append(cfg.Classes, string(c))
	}
	for _, name := range s.Scopes {
		sc, err := breaker.ParseScope(name)
		if err != nil {
			return breaker.SurgeConfig{}, err
		}
		cfg.Scopes = append(cfg.Scopes, sc)
	}
	return cfg, nil
}
