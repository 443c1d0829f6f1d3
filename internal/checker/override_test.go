package checker

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// overridden is the default policy with an override for the model of run's
// task (openai/gpt-4o): its timeouts retry after 400 ms rather than 1 s.
func overridden(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(`
overrides:
  - name: gpt-4o-fast
    match: {model: gpt-4o}
    network_timeout: {base_delay_ms: 400}
  - name: other-model
    match: {model: claude}
    network_timeout: {base_delay_ms: 9000, max_delay_ms: 9000}
`))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Guards the checker's model of overrides: a router that decides under the
// override matching the event and names it passes; one that ignores the
// override (decides with the base policy), or decides right but leaves the
// override's name off its records, is reported.
func TestCheckModelsOverrides(t *testing.T) {
	p := overridden(t)
	rep := runWith(t, p, p, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
		for _, x := range d {
			if x.Override != "gpt-4o-fast" {
				t.Fatalf("decision %s/%s under override %q, want gpt-4o-fast", x.Class, x.Route, x.Override)
			}
		}
		if d[0].Retry == nil || d[0].Retry.DelayMs != 400 {
			t.Fatalf("first retry %+v, want the override's 400 ms", d[0].Retry)
		}
		correct(b, d, in, ev, "")
	})
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("correct outputs under an override: %s", s.String())
	}

	cases := []struct {
		name   string
		router *policy.Policy
		mutate func(d []event.Decision)
		want   string
	}{
		{"override ignored", policy.Default(), func([]event.Decision) {}, "decided under override none (the base policy), want gpt-4o-fast"},
		{"name left off", p, func(d []event.Decision) {
			for i := range d {
				d[i].Override = ""
			}
		}, "decided under override none (the base policy), want gpt-4o-fast"},
		{"another override named", p, func(d []event.Decision) { d[2].Override = "other-model" }, "decided under override other-model, want gpt-4o-fast"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := runWith(t, c.router, p, func(b *logBuilder, d []event.Decision, in []*kgo.Record, ev []event.TaskEvent) {
				c.mutate(d)
				correct(b, d, in, ev, "")
			})
			if rep.ViolationsByCheck["audit.decision"] == 0 {
				t.Fatalf("no audit.decision violation; got %v", rep.ViolationsByCheck)
			}
			var s strings.Builder
			rep.WriteText(&s)
			if !strings.Contains(s.String(), c.want) {
				t.Errorf("report does not say %q:\n%s", c.want, s.String())
			}
		})
	}
}
