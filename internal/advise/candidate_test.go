package advise

import (
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// TestCandidateFile guards the candidate policy file: the proposals as
// entries of `overrides` (name, match with "*" for any, the one key of the
// class section) and an owner's SLA in `owners`, in the policy file's
// format.
func TestCandidateFile(t *testing.T) {
	p := policy.Default()
	r := Analyze(decideAll(p, workload.AdviceStream("adv", t0, true)), Options{Policy: p})
	b, err := Candidate(nil, r.Proposals)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"overrides:\n",
		"  - name: advise-acme-network_timeout\n    match: {provider: acme, model: \"*\", action: \"*\", prompt_template: \"*\"}\n    network_timeout: {max_retries: 1}\n",
		"  - name: advise-nova-nova-1-model_refusal\n    match: {provider: nova, model: nova-1, action: \"*\", prompt_template: \"*\"}\n    model_refusal: {min_confidence: 0.65}\n",
		"owners:\n  operations: {sla_ms: 7620000}\n",
		"# proposed by faultrouter policy advise: retry 2 of NETWORK_TIMEOUT",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the candidate lacks\n%s\nit reads:\n%s", want, got)
		}
	}
	// the policy package loads it, and decides with it as proposed
	cand, err := policy.Parse(b)
	if err != nil {
		t.Fatalf("the candidate does not load: %v\n%s", err, got)
	}
	acme := &event.TaskEvent{Provider: workload.StuckProvider, Model: "acme-small", Action: "refund"}
	if o, ok := cand.OverrideFor(acme); !ok || o.NetworkTimeout == nil || o.NetworkTimeout.MaxRetries != 1 || o.NetworkTimeout.BaseDelayMs != 1000 {
		t.Errorf("an acme event: override %+v (%v), want network_timeout.max_retries 1, the rest inherited", o, ok)
	}
	nova := &event.TaskEvent{Provider: workload.TrustedProvider, Model: workload.TrustedModel}
	if o, ok := cand.OverrideFor(nova); !ok || o.ModelRefusal == nil || o.ModelRefusal.MinConfidence != 0.65 {
		t.Errorf("a nova-1 event: override %+v (%v), want model_refusal.min_confidence 0.65", o, ok)
	}
	if _, ok := cand.OverrideFor(&event.TaskEvent{Provider: "openai", Model: "gpt-4o"}); ok {
		t.Error("an openai event is decided by an override, want the base policy")
	}
	if got := cand.Owners[workload.SlowOwner].SLAMs; got != 7620000 {
		t.Errorf("owners.%s.sla_ms %d, want 7620000", workload.SlowOwner, got)
	}
}

// TestCandidateKeepsTheRunningFile guards a candidate made from a policy
// file: its keys and comments stay, an owner already listed gets the new
// SLA beside its other keys, an override with the same match gets the key
// instead of a second entry (two would tie), and a name already taken is
// not reused.
func TestCandidateKeepsTheRunningFile(t *testing.T) {
	running := `# our policy
retry_budget: 3
owners:
  operations: {sla_ms: 1800000}
overrides:
  - name: advise-acme-network_timeout
    match: {provider: other}
    network_timeout: {base_delay_ms: 500}
  - name: acme-slow
    match: {provider: acme, model: "*"}
    network_timeout: {max_delay_ms: 9000}
`
	m := Match{"acme", "*", "*", "*"}
	n := Match{"nova", "nova-1", "*", "*"}
	props := []Proposal{
		{Name: "advise-acme-network_timeout", Kind: KindMaxRetries, Match: &m, Change: Change{Section: "network_timeout", Key: "max_retries", To: 1}},
		{Name: "advise-acme-network_timeout", Kind: KindMinConfidence, Match: &n, Change: Change{Section: "model_refusal", Key: "min_confidence", To: 0.65}},
		{Name: "operations", Kind: KindOwnerSLA, Owner: "operations", Change: Change{Key: "sla_ms", To: 7200000}},
	}
	b, err := Candidate([]byte(running), props)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{
		"# our policy\nretry_budget: 3\n",
		"operations: {sla_ms: 7200000}",
		"  - name: acme-slow\n    match: {provider: acme, model: \"*\"}\n    network_timeout: {max_delay_ms: 9000, max_retries: 1}\n",
		"  - name: advise-acme-network_timeout-2\n    match: {provider: nova, model: nova-1, action: \"*\", prompt_template: \"*\"}\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the candidate lacks\n%s\nit reads:\n%s", want, got)
		}
	}
	if strings.Count(got, "provider: acme") != 1 {
		t.Errorf("the candidate holds two overrides for provider acme:\n%s", got)
	}
}

// TestCandidateKeepsTheDecidingOverride guards a narrower entry written
// into a file whose broader override decides its events today: the new
// entry replaces that override for its events, so it starts from that
// override's sections (all of them, not only the changed class's), and the
// one key is changed.
func TestCandidateKeepsTheDecidingOverride(t *testing.T) {
	running := `overrides:
  - name: acme-all
    match: {provider: acme}
    network_timeout: {base_delay_ms: 500, max_retries: 4}
    model_refusal: {min_confidence: 0.9}
  - name: acme-big
    match: {provider: acme, model: "acme-big*"}
    network_timeout: {max_retries: 5}
  - name: acme-small-breakers
    match: {provider: acme, model: acme-small}
    breakers: {provider_model: {min_requests: 5}}
`
	m := Match{"acme", "acme-small", "*", "*"}
	props := []Proposal{{Name: "advise-acme-acme-small-network_timeout", Kind: KindMaxRetries, Class: event.ClassNetworkTimeout, Match: &m,
		Change: Change{Section: "network_timeout", Key: "max_retries", From: 4, To: 1}}}
	b, err := Candidate([]byte(running), props)
	if err != nil {
		t.Fatal(err)
	}
	cand, err := policy.Parse(b)
	if err != nil {
		t.Fatalf("the candidate does not load: %v\n%s", err, b)
	}
	small := &event.TaskEvent{Provider: "acme", Model: "acme-small"}
	o, ok := cand.OverrideFor(small)
	switch {
	case !ok || o.Name != "advise-acme-acme-small-network_timeout":
		t.Fatalf("an acme-small event is decided by %q (%v), want the new entry\n%s", o.Name, ok, b)
	case o.NetworkTimeout == nil || o.NetworkTimeout.MaxRetries != 1 || o.NetworkTimeout.BaseDelayMs != 500:
		t.Errorf("network_timeout %+v, want max_retries 1 and acme-all's base_delay_ms 500\n%s", o.NetworkTimeout, b)
	case o.ModelRefusal == nil || o.ModelRefusal.MinConfidence != 0.9:
		t.Errorf("model_refusal %+v, want acme-all's min_confidence 0.9 kept for acme-small\n%s", o.ModelRefusal, b)
	}
	if !strings.Contains(string(b), "override acme-all, which decided these events") {
		t.Errorf("the new entry does not say whose settings it carries:\n%s", b)
	}
	// an event the new entry does not select is decided as before
	if o, _ := cand.OverrideFor(&event.TaskEvent{Provider: "acme", Model: "acme-big-2"}); o.Name != "acme-big" {
		t.Errorf("an acme-big-2 event is decided by %q, want acme-big", o.Name)
	}
}

// TestCandidateOfARunningFileLoads guards proposals made against a running
// policy with overrides: a proposal whose match would tie with one of the
// running file's overrides (as specific, able to select the same events)
// is not made, so the candidate always loads and its what-if runs.
func TestCandidateOfARunningFileLoads(t *testing.T) {
	running := []byte(`overrides:
  - name: refunds
    match: {action: refund}
    business_rejected: {owner: operations}
`)
	p, err := policy.Parse(running)
	if err != nil {
		t.Fatal(err)
	}
	r := Analyze(decideAll(p, workload.AdviceStream("adv", t0, true)), Options{Policy: p})
	if len(r.Proposals) == 0 {
		t.Fatal("no proposals: the stream's patterns are gone")
	}
	for _, pr := range r.Proposals {
		if pr.Match != nil && pr.Match.depth() == 1 && pr.Match.Provider != "*" {
			t.Errorf("proposal %s at %s ties with override refunds (action=refund): both as specific, both select acme's refunds", pr.Name, pr.Match)
		}
	}
	b, err := Candidate(running, r.Proposals)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := policy.Parse(b); err != nil {
		t.Fatalf("the candidate does not load: %v\n%s", err, b)
	}
}
