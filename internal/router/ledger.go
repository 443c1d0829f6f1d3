package router

// ledger.go is the cost ledger's metrics: every committed decision of a task
// event accounts the attempt's usage by class and route, its cost by
// provider/model, prompt template and review owner (failed or succeeded),
// and the cost prevented it claims (policy.Claim) by class and stop and by
// provider/model and prompt template. An attempt already counted (a
// forward, a re-drive, a redelivery after the TTL: policy.Repeat) adds no
// usage. A claim that nets attempts off (made after the task's stop) is
// counted in the _netted_ series, since a counter only grows: cost prevented
// is cost_prevented_usd_total minus cost_prevented_netted_usd_total.
// internal/ledger sums the same from the audit topic for `faultrouter cost`.
//
// Label values come from bounded sets: class, route, stop and outcome are
// fixed; owners are the policy's; provider/model and prompt template keep
// their first maxLedgerKeys values each (those of one batch in no
// particular order), and any later one is counted as "other", so that a
// worker reporting a new model per request cannot grow the series without
// bound.

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// maxLedgerKeys bounds the provider/model and prompt template label values.
const maxLedgerKeys = 100

// otherKey is the label value of every key past maxLedgerKeys.
const otherKey = "other"

type ledgerMetrics struct {
	spend             *prometheus.CounterVec // class, route
	tokens            *prometheus.CounterVec // class, route
	elapsed           *prometheus.CounterVec // class, route
	byModel           *prometheus.CounterVec // provider_model, outcome
	byTemplate        *prometheus.CounterVec // prompt_template, outcome
	byOwner           *prometheus.CounterVec // owner
	prevented         *prometheus.CounterVec // class, stop
	preventedTries    *prometheus.CounterVec // class, stop
	preventedByKey    *prometheus.CounterVec // scope, key
	netted            *prometheus.CounterVec // class, stop
	nettedTries       *prometheus.CounterVec // class, stop
	models, templates boundedKeys
}

func newLedgerMetrics(ns string, reg prometheus.Registerer) *ledgerMetrics {
	c := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	m := &ledgerMetrics{
		spend: c("spend_usd_total", "Reported cost (usage.cost_usd) of the decided attempts, by class and route (a redelivery is not an attempt).",
			"class", "route"),
		tokens: c("spend_tokens_total", "Reported tokens of the decided attempts, by class and route.", "class", "route"),
		elapsed: c("spend_elapsed_seconds_total", "Reported elapsed time (usage.elapsed_ms) of the decided attempts, by class and route.",
			"class", "route"),
		byModel: c("spend_by_model_usd_total", "Reported cost of the decided attempts by provider/model (at most 100 values, then \"other\") and outcome (failed: not SUCCEEDED).",
			"provider_model", "outcome"),
		byTemplate: c("spend_by_template_usd_total", "Reported cost of the decided attempts by prompt template (at most 100 values, then \"other\") and outcome.",
			"prompt_template", "outcome"),
		byOwner: c("spend_by_owner_usd_total", "Reported cost of the attempts decided to review, by review owner.", "owner"),
		prevented: c("cost_prevented_usd_total", "Cost prevented: for each task the router stopped, the attempts a blind baseline (cost_prevented.baseline_retries) would still have made times the task's mean attempt cost; by class and stop.",
			"class", "stop"),
		preventedTries: c("cost_prevented_attempts_total", "Attempts a blind baseline would still have made after the router stopped a task, by class and stop.",
			"class", "stop"),
		preventedByKey: c("cost_prevented_by_key_usd_total", "Cost prevented by breaker key: scope provider_model or prompt_template (at most 100 keys each, then \"other\").",
			"scope", "key"),
		netted: c("cost_prevented_netted_usd_total", "Cost prevented netted off again: the attempts a stopped task made after its stop, at its mean attempt cost, by class and stop. Cost prevented is cost_prevented_usd_total minus this.",
			"class", "stop"),
		nettedTries: c("cost_prevented_netted_attempts_total", "Attempts a stopped task made after its stop, netted off the baseline attempts it had avoided, by class and stop.",
			"class", "stop"),
		models:    boundedKeys{max: maxLedgerKeys},
		templates: boundedKeys{max: maxLedgerKeys},
	}
	if reg != nil {
		reg.MustRegister(m.spend, m.tokens, m.elapsed, m.byModel, m.byTemplate, m.byOwner, m.prevented, m.preventedTries, m.preventedByKey,
			m.netted, m.nettedTries)
	}
	return m
}

// account adds the committed decisions of task events of one outcome (g,
// labelled by k) to the ledger's series in t.
func (m *ledgerMetrics) account(t *tally, k outcomeKey, g *tallySums) {
	class, route := string(k.class), string(k.route)
	t.add(m.spend, class, route, g.cost)
	t.add(m.tokens, class, route, g.tokens)
	t.add(m.elapsed, class, route, g.elapsed)
	if k.prevented {
		t.add(m.prevented, class, string(k.stop), g.preventedUSD)
		t.add(m.preventedTries, class, string(k.stop), g.preventedTries)
		if g.nettedUSD > 0 || g.nettedTries > 0 {
			t.add(m.netted, class, string(k.stop), g.nettedUSD)
			t.add(m.nettedTries, class, string(k.stop), g.nettedTries)
		}
	}
}

// accountLabels adds the tally's cost by model, template and review owner,
// and the cost prevented by model and template, to the ledger's series,
// and empties those sums.
func (m *ledgerMetrics) accountLabels(t *tally) {
	t.addLabelled(t.models, m.byModel, m.preventedByKey, "provider_model", func(k labelKey) string {
		return m.models.label(ledger.ModelKey(&event.TaskEvent{Provider: k.a, Model: k.b}))
	})
	t.addLabelled(t.templates, m.byTemplate, m.preventedByKey, "prompt_template", func(k labelKey) string {
		return m.templates.label(k.a)
	})
	for owner, cost := range t.owners {
		t.add(m.byOwner, owner, "", cost)
	}
	clear(t.owners)
}

// addLabelled adds sums to the series: the cost of each key, labelled by
// label(key), by outcome to byKey, and its cost prevented to
// prevented{scope, label}; and empties sums.
func (t *tally) addLabelled(sums map[labelKey]*labelSums, byKey, prevented *prometheus.CounterVec, scope string, label func(labelKey) string) {
	for k, g := range sums {
		key, outcome := label(k), "failed"
		if k.succeeded {
			outcome = "succeeded"
		}
		t.add(byKey, key, outcome, g.cost)
		if g.prevented {
			t.add(prevented, scope, key, g.preventedUSD)
		}
		t.freeLabel = append(t.freeLabel, g)
	}
	clear(sums)
}

// boundedKeys hands out label values: the first max keys as themselves,
// every later one as otherKey. "" is ledger.None.
type boundedKeys struct {
	mu   sync.Mutex
	max  int
	seen map[string]bool
}

func (b *boundedKeys) label(k string) string {
	if k == "" {
		k = ledger.None
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen[k] {
		return k
	}
	if len(b.seen) >= b.max {
		return otherKey
	}
	if b.seen == nil {
		b.seen = map[string]bool{}
	}
	b.seen[k] = true
	return k
}
