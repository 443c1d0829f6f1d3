package checker

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// Breakers that had to open and surges that had to fire. A breaker's
// rolling window and the surge detector live in one router process's
// memory: they count the outcomes of the task events that process decided,
// whichever partitions it owned ("trip anywhere, hold everywhere": the
// windows are per instance, the states are shared). The model takes each
// decision's process from its audit record (the producer ID of the
// instance's transactional producer, named by the instance's records on the
// alerts topic, and Options.Starts) and recomputes the windows with
// pkg/breaker, in the order of decision time.
//
// A breaker's window starts empty in a new process and is emptied each time
// the breaker closes (a success while half-open, a reset, a CLOSED state
// adopted from the breakers topic), so within a stretch of time where the
// breaker was CLOSED on that process (between two of its transitions on the
// alerts topic) the window holds exactly the outcomes the process decided
// in the stretch. The outcomes of one batch share its decision time and
// their order within it is not in the logs, so the check is a sound bound:
// a stretch must end (with a transition) at the latest in the millisecond
// of a batch after which the window trips whatever the order of its
// outcomes: its failures reach the policy's ratio with every success of the
// batch counted, and the window holds min_requests without them
// (breaker.missing_open). Outcomes decided in the very millisecond the
// breaker closed may have come before the close: they count as successes
// only.
//
// The surge detector counts every decided event of its watched scopes and
// fires for a class when, after an event of that class, the class holds
// min_events and its ratio of the key's events in the window; it re-arms
// when the key's window empties (or the ratio falls). After a batch with an
// event of a watched class whose window holds min_events of that class and
// the ratio, the class is in a surge whatever the order: the process must
// have written a surge alert for the key and class since the key's window
// was last empty (surge.missing).
//
// What the check cannot attribute it leaves out: decisions whose producer
// wrote nothing to the alerts topic (its instance is unknown) make every
// window of the time they span unchecked; a process that wrote nothing
// there, or wrote records without this release's headers (an earlier
// build, during an upgrade), is not checked; nor are more keys than
// breaker.MaxBreakers or breaker.MaxSurgeKeys (the router forgets keys
// then).

// observed is one decided task event as the process that decided it
// observed it.
type observed struct {
	ms    int64 // decision time, Unix ms
	ev    *event.TaskEvent
	class event.Class
	rec   *routed // its audit record
}

// procKey is one process of one router instance.
type procKey struct {
	instance string
	process  int
}

// outcome is one outcome a breaker counted.
type outcome struct {
	ms      int64
	failure bool
	task    string
}

// checkMissing checks that every breaker opened and every surge fired that
// the decisions of each process made certain.
func (c *checker) checkMissing() {
	names := map[int64]string{} // producer ID -> instance
	type alertRec struct {
		e         event.BreakerEvent
		partition int32
		offset    int64
	}
	var alerts []alertRec
	// builds says, per process, whether every record it wrote to the
	// alerts topic carries the headers of this release (faultrouter.alert,
	// faultrouter.breaker.latched): the model knows how such a build counts
	// its windows; an earlier build's process is not checked
	builds := map[procKey]bool{}
	for _, rec := range c.logs.Alerts {
		e, err := c.codec.DecodeBreakerEvent(rec.Value)
		if err != nil {
			continue
		}
		h := codec.ParseBreakerHeaders(rec.Headers)
		if e.Instance == "" {
			e.Instance = h.Instance
		}
		if e.Instance == "" {
			continue
		}
		names[rec.ProducerID] = e.Instance
		k := procKey{e.Instance, c.process(e.Instance, e.At.Time)}
		current := e.Kind == event.BreakerKindTransition && h.LatchKnown || e.Kind == event.BreakerKindAlert && h.Alert != ""
		if known, ok := builds[k]; !ok || known {
			builds[k] = current
		}
		if e.Kind == event.BreakerKindTransition || e.Kind == event.BreakerKindAlert && h.Alert == codec.AlertSurge {
			alerts = append(alerts, alertRec{e, rec.Partition, rec.Offset})
		}
	}

	// the decisions each process observed; the time spans of those no
	// instance is known for
	byProc := map[procKey][]observed{}
	var unknown [][2]int64
	for _, in := range c.inputs {
		if in.kind != inTask || in.audit == nil || in.decided.Route == event.RouteDrop {
			continue
		}
		o := observed{ms: in.audit.at().UnixMilli(), ev: &in.event, class: in.decided.Class, rec: in.audit}
		inst, ok := names[in.audit.rec.ProducerID]
		if !ok {
			c.rep.Unattributed++
			unknown = append(unknown, [2]int64{o.ms, o.ms})
			continue
		}
		k := procKey{inst, c.process(inst, in.audit.at())}
		byProc[k] = append(byProc[k], o)
	}
	unknown = mergeSpans(unknown, c.o.Policy)
	overlaps := func(from, to int64) bool {
		return slices.ContainsFunc(unknown, func(s [2]int64) bool { return s[0] <= to && s[1] >= from })
	}

	transitions := map[procKey]map[breaker.Ref][]alertRec{}
	surges := map[procKey]map[surgeKey][]int64{}
	for _, a := range alerts {
		sc, err := breaker.ParseScope(a.e.Scope)
		if err != nil {
			continue
		}
		ref := breaker.Ref{Scope: sc, Key: a.e.Key}
		k := procKey{a.e.Instance, c.process(a.e.Instance, a.e.At.Time)}
		if a.e.Kind == event.BreakerKindTransition {
			if transitions[k] == nil {
				transitions[k] = map[breaker.Ref][]alertRec{}
			}
			transitions[k][ref] = append(transitions[k][ref], a)
			continue
		}
		if surges[k] == nil {
			surges[k] = map[surgeKey][]int64{}
		}
		sk := surgeKey{ref, a.e.Class}
		surges[k][sk] = append(surges[k][sk], a.e.At.UnixMilli())
	}

	procs := make([]procKey, 0, len(byProc))
	for k := range byProc {
		procs = append(procs, k)
	}
	slices.SortFunc(procs, func(a, b procKey) int {
		return cmp.Or(cmp.Compare(a.instance, b.instance), cmp.Compare(a.process, b.process))
	})
	for _, k := range procs {
		obs := byProc[k]
		if !builds[k] { // wrote nothing to the alerts topic, or as an earlier build
			c.rep.ProcessesUnchecked++
			continue
		}
		slices.SortFunc(obs, func(a, b observed) int {
			return cmp.Or(cmp.Compare(a.ms, b.ms), cmp.Compare(a.rec.rec.Partition, b.rec.rec.Partition), cmp.Compare(a.rec.rec.Offset, b.rec.rec.Offset))
		})
		ts := transitions[k]
		for _, list := range ts {
			slices.SortFunc(list, func(a, b alertRec) int {
				return cmp.Or(cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
			})
		}
		c.missingOpens(k, obs, func(ref breaker.Ref) []alertRecTime {
			var out []alertRecTime
			for _, a := range ts[ref] {
				out = append(out, alertRecTime{ms: a.e.At.UnixMilli(), to: a.e.To})
			}
			return out
		}, overlaps)
		c.missingSurges(k, obs, surges[k], overlaps)
	}
}

// alertRecTime is a transition of a breaker: when, and the state entered.
type alertRecTime struct {
	ms int64
	to event.BreakerStateName
}

// surgeKey is one watched class of one key.
type surgeKey struct {
	ref   breaker.Ref
	class event.Class
}

// mergeSpans widens each time of an unattributed decision by the longest
// window (a window that holds it may reach that far) and merges them.
func mergeSpans(spans [][2]int64, p *policy.Policy) [][2]int64 {
	if len(spans) == 0 {
		return nil
	}
	w := max(p.Breakers.ProviderModel.WindowMs, p.Breakers.Downstream.WindowMs, p.Breakers.PromptTemplate.WindowMs, p.Surge.WindowMs)
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	out := [][2]int64{{spans[0][0] - w, spans[0][1] + w}}
	for _, s := range spans[1:] {
		if last := &out[len(out)-1]; s[0]-w <= last[1] {
			last[1] = max(last[1], s[1]+w)
		} else {
			out = append(out, [2]int64{s[0] - w, s[1] + w})
		}
	}
	return out
}

// start is when process k began, Unix ms (math.MinInt64 before the first
// known start).
func (c *checker) start(k procKey) int64 {
	if starts := c.o.Starts[k.instance]; k.process >= 1 && k.process <= len(starts) {
		return starts[k.process-1].UnixMilli()
	}
	return math.MinInt64
}

// missingOpens checks the breakers of process k: every stretch during
// which a breaker was CLOSED there ends no later than the batch after
// which its window trips in any order.
func (c *checker) missingOpens(k procKey, obs []observed, transitionsOf func(breaker.Ref) []alertRecTime, overlaps func(from, to int64) bool) {
	outcomes := map[breaker.Ref][]outcome{}
	var refs []breaker.Ref
	for _, o := range obs {
		for _, ref := range policy.BreakerRefs(o.ev) {
			if oc, ok := policy.BreakerOutcome(ref, o.ev, o.class); ok {
				if outcomes[ref] == nil {
					refs = append(refs, ref)
				}
				outcomes[ref] = append(outcomes[ref], outcome{o.ms, oc.Failure, o.ev.TaskID})
			}
		}
	}
	if len(refs) >= breaker.MaxBreakers {
		return // the router forgets breakers then: not modelled
	}
	for _, ref := range refs {
		cfg := c.breakerConfig(ref)
		from, closed := c.start(k), true
		for _, t := range transitionsOf(ref) {
			if closed {
				c.closedStretch(k, ref, cfg, outcomes[ref], from, t.ms, overlaps)
			}
			closed = t.to == breaker.Closed.Name()
			if closed {
				from = t.ms
			}
		}
		if closed {
			c.closedStretch(k, ref, cfg, outcomes[ref], from, math.MaxInt64, overlaps)
		}
	}
}

// closedStretch checks one stretch [from, to] (Unix ms) during which ref was
// CLOSED on process k: the window of the outcomes decided in it must not
// trip, in any order, before to.
func (c *checker) closedStretch(k procKey, ref breaker.Ref, cfg breaker.Config, outs []outcome, from, to int64, overlaps func(from, to int64) bool) {
	lo, _ := slices.BinarySearchFunc(outs, from, func(o outcome, ms int64) int { return cmp.Compare(o.ms, ms) })
	if lo == len(outs) || outs[lo].ms > to {
		return // nothing decided in it
	}
	if overlaps(from, to) {
		c.rep.BreakerStretchesUnchecked++
		return
	}
	c.rep.BreakerStretches++
	w, ties := breaker.NewWindow(cfg), breaker.NewWindow(cfg)
	for i := lo; i < len(outs) && outs[i].ms <= to; {
		ms := outs[i].ms
		var fails, oks int32
		var task string // the batch's last failure
		j := i
		for ; j < len(outs) && outs[j].ms == ms; j++ {
			if outs[j].failure {
				fails++
				task = outs[j].task
			} else {
				oks++
			}
		}
		if ms == from { // decided in the millisecond it closed: perhaps before
			for range fails + oks {
				ties.Add(time.UnixMilli(ms), false)
			}
			i = j
			continue
		}
		at := time.UnixMilli(ms)
		f0, r0 := w.Counts(at)
		_, tied := ties.Counts(at)
		certain := fails > 0 && cfg.Trips(f0+fails, r0+fails) && cfg.Trips(f0+fails, r0+fails+oks+tied)
		if certain && ms == to {
			c.rep.BreakerTrips++ // it opened in that batch
			return
		}
		if certain && ms < to {
			until := "it stayed CLOSED"
			if to != math.MaxInt64 {
				until = "its next transition is at " + stamp(time.UnixMilli(to))
			}
			c.violate("breaker.missing_open", task, "%s on instance %s: at %s its window held %d failures of %d outcomes decided there since %s (ratio %v, min %d), but %s",
				ref, k.instance, stamp(at), f0+fails, r0+fails+oks, stampMs(from), cfg.FailureRatio, cfg.MinRequests, until)
			return
		}
		for ; i < j; i++ {
			w.Add(at, outs[i].failure)
		}
	}
}

func stampMs(ms int64) string {
	if ms == math.MinInt64 {
		return "the process started"
	}
	return stamp(time.UnixMilli(ms))
}

// missingSurges checks the surge alerts of process k: after a batch with an
// event of a watched class whose window holds min_events of the class and
// the ratio, the process has alerted that surge since the key's window was
// last empty.
func (c *checker) missingSurges(k procKey, obs []observed, alerted map[surgeKey][]int64, overlaps func(from, to int64) bool) {
	p := c.o.Policy.Surge
	if len(p.Classes) == 0 {
		return
	}
	cfg, err := p.Config()
	if err != nil {
		return
	}
	sg, err := breaker.NewSurges(cfg)
	if err != nil {
		return
	}
	keys := map[breaker.Ref]bool{}
	rearmed := map[breaker.Ref]int64{} // when each key's window was last empty
	reported := map[surgeKey]int64{}
	for i := 0; i < len(obs); {
		ms := obs[i].ms
		at := time.UnixMilli(ms)
		j := i
		for ; j < len(obs) && obs[j].ms == ms; j++ {
		}
		group := obs[i:j]
		for _, o := range group {
			for _, ref := range policy.BreakerRefs(o.ev) {
				if _, total := sg.Counts(ref, "", at); total == 0 {
					rearmed[ref] = ms
				}
				keys[ref] = true
			}
		}
		if len(keys) >= breaker.MaxSurgeKeys {
			return // the router forgets keys then: not modelled
		}
		touched := map[surgeKey]string{} // the last task of each
		for _, o := range group {
			for _, ref := range policy.BreakerRefs(o.ev) {
				sg.Record(ref, string(o.class), o.ev.TaskID, at)
				touched[surgeKey{ref, o.class}] = o.ev.TaskID
			}
		}
		i = j
		for sk, task := range touched {
			n, total := sg.Counts(sk.ref, string(sk.class), at)
			if n < cfg.MinEvents || float64(n) < cfg.Ratio*float64(total) || !slices.Contains(p.Classes, sk.class) {
				continue
			}
			since := rearmed[sk.ref]
			if slices.ContainsFunc(alerted[sk], func(a int64) bool { return a >= since && a <= ms }) {
				c.rep.SurgesCertain++
				continue
			}
			if overlaps(ms, ms) {
				c.rep.SurgesUnchecked++
				continue
			}
			if r, ok := reported[sk]; ok && r == since {
				continue // one violation per surge
			}
			reported[sk] = since
			c.violate("surge.missing", task, "%s %s on instance %s: at %s the window holds %d %s of %d events (min %d, ratio %v), but no surge alert since %s",
				sk.ref, sk.class, k.instance, stamp(at), n, sk.class, total, cfg.MinEvents, cfg.Ratio, stamp(time.UnixMilli(since)))
		}
	}
}
