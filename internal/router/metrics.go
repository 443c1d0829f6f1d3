package router

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/plugin/kprom"

	"github.com/faultrouter/faultrouter/internal/logging"
	"github.com/faultrouter/faultrouter/internal/router/decode"
	"github.com/faultrouter/faultrouter/internal/router/restore"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// metrics are the router's Prometheus metrics. Label values come from fixed
// small sets (class, route, error kind), never from task IDs.
type metrics struct {
	consumed         prometheus.Counter
	routed           *prometheus.CounterVec
	dropped          prometheus.Counter
	poison           *prometheus.CounterVec
	retriesPublished prometheus.Counter
	txCommitted      prometheus.Counter
	txAborted        prometheus.Counter
	sessionRestarts  prometheus.Counter
	batchSeconds     prometheus.Histogram
	// batchRecords and batchBytes are the size of each committed batch;
	// batchLimit* the limit of the next one (batchsize.go)
	batchRecords      prometheus.Histogram
	batchBytes        prometheus.Histogram
	batchLimitRecords prometheus.Gauge
	batchLimitBytes   prometheus.Gauge
	restore           *restore.Metrics // the restore's (package restore)
	ready             prometheus.Gauge
	registryWaiting   prometheus.Gauge // registry.go
	tasksStarted      prometheus.Counter
	tasksFinished     *prometheus.CounterVec
	taskSeconds       *prometheus.HistogramVec
	taskSecondsOf     map[event.Class]prometheus.Observer // taskObserver
	costUSD           *prometheus.CounterVec
	tokens            *prometheus.CounterVec
	forwarded         *prometheus.CounterVec // package forward
	partitions        *prometheus.GaugeVec
	partitionChanges  *prometheus.CounterVec
	consumerLag       *prometheus.GaugeVec // lag.go
	lag               lag                  // the per-partition lags behind consumerLag
	ledger            *ledgerMetrics       // ledger.go
	kprom             *kprom.Metrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = "faultrouter"
	m := &metrics{
		consumed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "records_consumed_total",
			Help: "Input records consumed from ingress and decisions."}),
		routed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "routed_total",
			Help: "Input records routed, by class and route (committed transactions only)."}, []string{"class", "route"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "redeliveries_dropped_total",
			Help: "Exact redeliveries (same event_id) routed DROP."}),
		poison: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "deadlettered_input_total",
			Help: "Input records that could not be decoded or accepted, by error kind."}, []string{"kind"}),
		retriesPublished: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "retries_published_total",
			Help: "Retry records published to the retry topic when due."}),
		txCommitted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "transactions_committed_total",
			Help: "Kafka transactions committed."}),
		txAborted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "transactions_aborted_total",
			Help: "Kafka transactions aborted (rebalance, produce error, fencing)."}),
		sessionRestarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "session_restarts_total",
			Help: "Transactional sessions re-created after an error."}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "batch_seconds",
			Help: "Time from poll to committed state per batch.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "batch_records",
			Help: "Input records per committed batch (one transaction).", Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		batchBytes: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "batch_bytes",
			Help: "Bytes of the input keys and values per committed batch.", Buckets: prometheus.ExponentialBuckets(1024, 4, 10)}),
		batchLimitRecords: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "batch_limit_records",
			Help: "Input records the next batch may take: MaxPollRecords when caught up, up to MaxBatchRecords under a backlog."}),
		batchLimitBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "batch_limit_bytes",
			Help: "Bytes of input keys and values the next batch may take (it may pass them by one fetch)."}),
		restore: restore.NewMetrics(),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "ready",
			Help: "1 once the state is restored and the router is routing."}),
		registryWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "registry_waiting",
			Help: "1 while routing waits for a schema registry that does not answer (nothing is dead-lettered for it)."}),
		consumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "consumer_lag_records",
			Help: "Records not yet consumed on the partitions this instance owns, per input topic (approximate, see lag.go)."}, []string{"topic"}),
	}
	m.tasksStarted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "tasks_started_total",
		Help: "Tasks seen for the first time: the denominator of per-task rates (never the attempts)."})
	m.tasksFinished = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tasks_terminal_total",
		Help: "Tasks that reached a terminal decision, by the class and route of that decision."}, []string{"class", "route"})
	m.taskSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "task_terminal_seconds",
		Help:    "Time from a task's first event to its terminal decision (event time), by class.",
		Buckets: prometheus.ExponentialBuckets(0.5, 2, 16)}, []string{"class"})
	m.taskSecondsOf = map[event.Class]prometheus.Observer{}
	m.costUSD = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "cost_usd_total",
		Help: "Reported cost of the routed attempts, by class."}, []string{"class"})
	m.tokens = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tokens_total",
		Help: "Reported tokens of the routed attempts, by class."}, []string{"class"})
	m.forwarded = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "forwarded_total",
		Help: "Input records on the wrong partition for their task, forwarded to its partition, by topic."}, []string{"topic"})
	m.partitions = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "partitions",
		Help: "Partition count of ingress, decisions and state as last read."}, []string{"topic"})
	m.partitionChanges = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "partition_changes_total",
		Help: "Partition count changes of ingress, decisions or state seen while running."}, []string{"topic"})
	m.ledger = newLedgerMetrics(ns, reg)
	if reg != nil {
		reg.MustRegister(m.forwarded, m.partitions, m.partitionChanges)
		reg.MustRegister(m.restore.Collectors()...)
		reg.MustRegister(m.tasksStarted, m.tasksFinished, m.taskSeconds, m.costUSD, m.tokens)
		reg.MustRegister(m.consumed, m.routed, m.dropped, m.poison, m.retriesPublished, m.txCommitted,
			m.txAborted, m.sessionRestarts, m.batchSeconds, m.batchRecords, m.batchBytes, m.batchLimitRecords, m.batchLimitBytes, m.ready, m.consumerLag, m.registryWaiting)
		m.kprom = kprom.NewMetrics(ns, kprom.Registerer(reg))
	}
	return m
}

// countTask puts one routed input in t, the batch's tally: its class and
// route get the input and, for a task event decided (not a redelivery
// dropped), its usage and the cost its stop prevented, which its model,
// template and review owner get too (ledger.go).
func (m *metrics) countTask(t *tally, in *input) {
	d := &in.decision
	k := outcomeKey{class: d.Class, route: d.Route}
	// a task event decided, and one that could not be routed (its attempt
	// happened): the ledger's attempts, as the audit records count them
	task := (in.Kind == decode.Task || in.Unwritable) && d.Route != event.RouteDrop
	if !task {
		sumsOf(&t.outcomes, &t.free, k).inputs++
		return
	}
	ev := &in.Event
	k.task, k.finished = true, in.finished
	pr := in.prevented
	if pr != nil {
		k.stop, k.prevented = policy.Stop(pr.Stop), true
	}
	g := sumsOf(&t.outcomes, &t.free, k)
	g.inputs++
	var cost float64
	if in.repeat == "" { // an attempt already counted (policy.Repeat): its usage is not counted again
		cost = ev.Usage.CostUSD
		g.cost += cost
		g.tokens += float64(ev.Usage.Tokens)
		g.elapsed += float64(ev.Usage.ElapsedMs) / 1000
	}
	succeeded := d.Class == event.ClassSucceeded
	mg := sumsOf(&t.models, &t.freeLabel, labelKey{a: ev.Provider, b: ev.Model, succeeded: succeeded})
	tg := sumsOf(&t.templates, &t.freeLabel, labelKey{a: ev.PromptTemplate, succeeded: succeeded})
	mg.cost += cost
	tg.cost += cost
	if pr != nil {
		g.addPrevented(pr)
		mg.prevented, tg.prevented = true, true
		if pr.USD >= 0 { // what a claim nets off is netted by outcome only
			mg.preventedUSD += pr.USD
			tg.preventedUSD += pr.USD
		}
	}
	if d.Review != nil {
		if t.owners == nil {
			t.owners = map[string]float64{}
		}
		t.owners[d.Review.Owner] += cost
	}
	if in.started {
		t.started++
	}
	if in.finished {
		m.taskObserver(d.Class).Observe(float64(max(in.taskMs, 0)) / 1000)
	}
}

// taskObserver is faultrouter_task_terminal_seconds of a class, looked up
// once per class.
func (m *metrics) taskObserver(c event.Class) prometheus.Observer {
	o, ok := m.taskSecondsOf[c]
	if !ok {
		o = m.taskSeconds.WithLabelValues(string(c))
		m.taskSecondsOf[c] = o
	}
	return o
}

// tally sums a batch's committed decisions, so that each series is updated
// once per batch instead of once per input: looking a series up by its
// label values and adding to it cost more per input than deciding a retry.
// It sums per family of labels, each keyed by what its series are
// labelled by: an input's outcome (class, route, stop), its model, its
// template, its review owner. (One group per input's every label value
// together had about as many groups as inputs in a batch: 40 templates
// times the models times the classes.) flush spreads them over their
// series. Used by the handle goroutine only.
type tally struct {
	outcomes  map[outcomeKey]*tallySums
	models    map[labelKey]*labelSums // provider and model
	templates map[labelKey]*labelSums // prompt template
	owners    map[string]float64      // review owner: cost
	free      []*tallySums            // the sums of earlier batches, reused
	freeLabel []*labelSums
	adds      map[series]float64
	started   int
}

// outcomeKey is what a routed input's outcome series are labelled by.
type outcomeKey struct {
	class     event.Class
	route     event.Route
	task      bool // a task event decided, not dropped: its usage counts
	finished  bool // the decision ended its task
	prevented bool // the decision claims cost prevented (policy.Claim) for a stop
	stop      policy.Stop
}

// tallySums are an outcome's sums.
type tallySums struct {
	inputs, cost, tokens, elapsed float64
	// the claims of cost prevented, and the amounts netted off it (negative
	// claims, as positive numbers: a counter only grows)
	preventedUSD, preventedTries float64
	nettedUSD, nettedTries       float64
}

// labelKey is a model (a: provider, b: model) or a template (a) with the
// outcome, succeeded or failed, its ledger series are labelled by.
type labelKey struct {
	a, b      string
	succeeded bool
}

// labelSums are the cost of a model's or template's inputs, and the cost
// their stops claim prevented (the net of the claims: preventedByKey).
type labelSums struct {
	cost         float64
	prevented    bool // a claim was made: its series exists, even at 0
	preventedUSD float64
}

// addPrevented adds one claim of cost prevented, split into what it adds
// and what it nets off.
func (g *tallySums) addPrevented(pr *event.Prevented) {
	if pr.USD >= 0 {
		g.preventedUSD += pr.USD
	} else {
		g.nettedUSD -= pr.USD
	}
	if pr.Attempts >= 0 {
		g.preventedTries += float64(pr.Attempts)
	} else {
		g.nettedTries -= float64(pr.Attempts)
	}
}

// series is one counter series: its family and one or two label values
// (b is "" for a one-label family).
type series struct {
	vec  *prometheus.CounterVec
	a, b string
}

// sumsOf returns the sums of k in *m, made when k has none: taken from
// free (zeroed) while it has any, the sums of earlier batches.
func sumsOf[K comparable, V any](m *map[K]*V, free *[]*V, k K) *V {
	if g, ok := (*m)[k]; ok {
		return g
	}
	if *m == nil {
		*m = map[K]*V{}
	}
	var g *V
	if n := len(*free); n > 0 {
		g, *free = (*free)[n-1], (*free)[:n-1]
		var zero V
		*g = zero
	} else {
		g = new(V)
	}
	(*m)[k] = g
	return g
}

// add adds v to the series vec{a, b}; b "" for a family of one label. An
// add of 0 still creates the series, as Add(0) does.
func (t *tally) add(vec *prometheus.CounterVec, a, b string, v float64) {
	if t.adds == nil {
		t.adds = map[series]float64{}
	}
	t.adds[series{vec, a, b}] += v
}

// flush adds the tally to the counters and empties it.
func (t *tally) flush(m *metrics) {
	for k, g := range t.outcomes {
		class, route := string(k.class), string(k.route)
		t.add(m.routed, class, route, g.inputs)
		if k.task {
			if k.finished {
				t.add(m.tasksFinished, class, route, g.inputs)
			}
			t.add(m.costUSD, class, "", g.cost)
			t.add(m.tokens, class, "", g.tokens)
			m.ledger.account(t, k, g)
		}
		t.free = append(t.free, g)
	}
	clear(t.outcomes)
	m.ledger.accountLabels(t)
	for s, v := range t.adds {
		if s.b == "" {
			s.vec.WithLabelValues(s.a).Add(v)
		} else {
			s.vec.WithLabelValues(s.a, s.b).Add(v)
		}
	}
	clear(t.adds)
	m.tasksStarted.Add(float64(t.started))
	t.started = 0
}

// observeBatch records a committed batch's size and the limit of the next
// one (batchsize.go).
func (m *metrics) observeBatch(seen batchSeen, next batchLimit) {
	m.batchRecords.Observe(float64(seen.records))
	m.batchBytes.Observe(float64(seen.bytes))
	m.batchLimitRecords.Set(float64(next.records))
	m.batchLimitBytes.Set(float64(next.bytes))
}

// countCommitted counts the decisions of a committed batch and logs each
// one: only committed ones.
func (r *Router) countCommitted(b *batch) {
	if r.lines == nil {
		r.lines = logging.NewLines(r.log)
	}
	defer r.lines.Flush() // the batch's decision lines, to the log at once
	for i := range b.inputs {
		in := &b.inputs[i]
		if in.Kind == decode.Forward {
			r.metrics.forwarded.WithLabelValues(in.Rec.Topic).Inc()
			r.logDecision(in)
			continue
		}
		r.metrics.countTask(&b.tally, in)
		switch {
		case in.Kind == decode.Poison:
			r.metrics.poison.WithLabelValues(in.ErrKind).Inc()
		case in.decision.Route == event.RouteDrop && in.Kind == decode.Task:
			r.metrics.dropped.Inc()
		}
		r.logDecision(in)
	}
	b.tally.flush(r.metrics)
	for _, rec := range b.out {
		if rec.Topic == r.cfg.Topics.Retry {
			r.metrics.retriesPublished.Inc()
		}
	}
}
