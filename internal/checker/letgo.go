package checker

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// letGo checks that breakers no one uses are let go: a breaker that no
// outcome, retry, transition or shared state touched for its scope's idle
// time (breaker.Set.IdleOf: twice its cooldown and window, at least four
// rechecks) closes and is forgotten, on every instance, so that providers,
// actions and templates that come and go leave nothing behind. A stretch of
// OPEN or HALF_OPEN on an instance that outlasts the last use of its
// breaker by that idle time plus Options.RetryLate (a router looks on every
// poll; a paused one looks later) is reported (breaker.not_let_go). A
// latched stretch is not: a latch holds until its items are decided or a
// person resets it. What counts as a use is taken from every instance
// (each reads the others' shared states), so a stretch is reported only
// when nothing anywhere touched its breaker.
func (c *checker) letGo(timelines map[breakerKey][]span, ts []transition) {
	u := c.breakerUses(ts)
	lastUse := func(ref breaker.Ref, t time.Time) time.Time { return u.last(ref, t, true) }
	keys := make([]breakerKey, 0, len(timelines))
	for k := range timelines {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b breakerKey) int {
		return strings.Compare(a.instance+"\x00"+a.ref.String(), b.instance+"\x00"+b.ref.String())
	})
	for _, k := range keys {
		if k.ref.Key == breaker.OverflowKey {
			continue
		}
		idle := breaker.IdleOf(c.breakerConfig(k.ref))
		for _, s := range timelines[k] {
			if s.state == breaker.Closed.Name() || s.latched {
				continue
			}
			end := s.to
			if end.IsZero() {
				end = c.logs.End
			}
			// a process that stopped let nothing go: the stretch ends with it
			// (the next start, or a stop with none after)
			for _, st := range slices.Concat(c.o.Starts[k.instance], c.o.Stops[k.instance]) {
				if st.After(s.from) && st.Before(end) {
					end = st
				}
			}
			used := lastUse(k.ref, end)
			if used.Before(s.from) {
				used = s.from
			}
			if end.Sub(used) > idle {
				c.rep.IdleStretches++
			}
			if by := used.Add(idle + c.o.RetryLate); end.After(by) {
				c.violate("breaker.not_let_go", "", "%s on instance %s stayed %s from %s to %s; nothing used it after %s, so it should have been let go (idle %s) by %s",
					k.ref, k.instance, s.state, stamp(s.from), stamp(end), stamp(used), idle, stamp(by))
			}
		}
	}
	c.sharedLetGo(timelines, u)
}

// breakerUses are the uses of every breaker, from every instance: the
// decisions of an input that names it, the retries held behind it or
// published into it, its transitions, and the records of the breakers
// topic that name it (shared states, RESETs). The transitions an instance
// adopted from the breakers topic are kept apart: at a process's start
// they are the states live on the topic, read again, not a use anyone
// made of the breaker then.
type breakerUses struct {
	points  map[breaker.Ref][]time.Time    // uses at an instant
	adopted map[breaker.Ref][]time.Time    // transitions adopted from the topic
	spans   map[breaker.Ref][][2]time.Time // uses over a stretch: a retry held behind it is asked again and again
}

func (c *checker) breakerUses(ts []transition) *breakerUses {
	u := &breakerUses{points: map[breaker.Ref][]time.Time{}, adopted: map[breaker.Ref][]time.Time{}, spans: map[breaker.Ref][][2]time.Time{}}
	for _, in := range c.inputs {
		if in.kind != inTask || in.audit == nil {
			continue
		}
		at := in.audit.at()
		for _, ref := range policy.BreakerRefs(&in.event) {
			u.points[ref] = append(u.points[ref], at)
		}
	}
	for _, xs := range c.retries {
		for _, x := range xs {
			end := c.logs.End
			for _, p := range x.ends() {
				end = p.at()
				break
			}
			if x.superseded != nil && x.superseded.Before(end) {
				end = *x.superseded
			}
			for _, ref := range x.refs {
				u.spans[ref] = append(u.spans[ref], [2]time.Time{x.decided, end})
			}
		}
	}
	for _, t := range ts {
		if sc, err := breaker.ParseScope(t.e.Scope); err == nil {
			ref := breaker.Ref{Scope: sc, Key: t.e.Key}
			if codec.ParseBreakerHeaders(t.rec.Headers).AdoptedFrom != "" {
				u.adopted[ref] = append(u.adopted[ref], t.e.At.Time)
			} else {
				u.points[ref] = append(u.points[ref], t.e.At.Time)
			}
		}
	}
	for _, r := range c.logs.Breakers {
		if ref, _, ok := breakerRecordRef(r); ok {
			u.points[ref] = append(u.points[ref], r.Timestamp)
		}
	}
	return u
}

// last is the last use of ref before t (the transition that ends a
// stretch at t is no use of it), the transitions adopted from the topic
// counted or not.
func (u *breakerUses) last(ref breaker.Ref, t time.Time, adopted bool) time.Time {
	var last time.Time
	for _, p := range u.points[ref] {
		if p.Before(t) && p.After(last) {
			last = p
		}
	}
	for _, p := range u.adopted[ref] {
		if adopted && p.Before(t) && p.After(last) {
			last = p
		}
	}
	for _, s := range u.spans[ref] {
		if !s[0].Before(t) {
			continue
		}
		end := s[1]
		if end.After(t) {
			end = t
		}
		if end.After(last) {
			last = end
		}
	}
	return last
}

// breakerRecordRef is the breaker a record of the breakers topic names: a
// failure-rate state's ("<scope>/<key>") or a RESET's ("reset/<scope>/<key>",
// reset true); latch items and control records name none.
func breakerRecordRef(r *kgo.Record) (ref breaker.Ref, reset, ok bool) {
	k := string(r.Key)
	if rest, found := strings.CutPrefix(k, event.BreakerResetPrefix); found {
		k, reset = rest, true
	}
	scope, key, found := event.ParseBreakerKey(k)
	if !found || !reset && strings.HasPrefix(string(r.Key), event.BreakerItemPrefix) {
		return breaker.Ref{}, false, false
	}
	sc, err := breaker.ParseScope(scope)
	if err != nil {
		return breaker.Ref{}, false, false
	}
	return breaker.Ref{Scope: sc, Key: key}, reset, true
}

// sharedLetGo checks the breakers topic's side of letting go: a breaker let
// go has its failure-rate state tombstoned there, so that an instance that
// starts does not adopt the OPEN or HALF_OPEN of a key no one uses any more
// and keep it (breaker.shared_not_let_go). For each breaker whose latest
// failure-rate record, in the topic's order, is an OPEN or HALF_OPEN state
// with no RESET of the breaker after it, nothing may have used the breaker
// anywhere for its idle time plus Options.LetGoLate before the logs were
// read. A process that starts adopts the states live on the topic, which
// its router takes as a use: a start before that bound moves it to the
// start's idle time plus LetGoLate; a start after it, or the adoption a
// start makes, is no use (a router that kept the state past the bound has
// every start adopt it again). A breaker latched at the end is left out (a latch
// holds until its items are decided or a person resets it), and so is one
// whose latest record is in a transaction whose end was not read.
//
// It counts (Report.IdleShared) the breakers that were left OPEN or
// HALF_OPEN by their last use and stayed unused: those reported, and those
// whose state was tombstoned with no use for half their idle time before
// (let go, not closed by an outcome).
func (c *checker) sharedLetGo(timelines map[breakerKey][]span, u *breakerUses) {
	if len(c.logs.Breakers) == 0 {
		return
	}
	latched := map[breaker.Ref]bool{}
	for k, tl := range timelines {
		if n := len(tl); n > 0 && tl[n-1].latched && tl[n-1].to.IsZero() {
			latched[k.ref] = true
		}
	}
	var starts []time.Time
	for _, ss := range c.o.Starts {
		starts = append(starts, ss...)
	}
	slices.SortFunc(starts, time.Time.Compare)
	// each breaker's failure-rate states and RESETs, in the topic's order
	hs := map[breaker.Ref][]logRec{}
	l := readBreakerLog(c.logs.Breakers)
	for _, r := range l.recs {
		ref, reset, ok := breakerRecordRef(r.rec)
		if !ok || reset && r.rec.Value == nil { // a RESET's tombstone ends nothing
			continue
		}
		hs[ref] = append(hs[ref], r)
	}
	live := func(r logRec) bool { // an OPEN or HALF_OPEN state
		_, reset, _ := breakerRecordRef(r.rec)
		return !reset && r.rec.Value != nil
	}
	refs := slices.SortedFunc(maps.Keys(hs), func(a, b breaker.Ref) int { return strings.Compare(a.String(), b.String()) })
	for _, ref := range refs {
		recs := hs[ref]
		if ref.Key == breaker.OverflowKey || latched[ref] {
			continue
		}
		idle := breaker.IdleOf(c.breakerConfig(ref))
		last := recs[len(recs)-1]
		if last.committed.IsZero() {
			continue // it may yet be aborted, or commit
		}
		if !live(last) {
			// ended: count it when it was let go, its last OPEN or
			// HALF_OPEN outlasting the breaker's uses by its idle time
			end := -1
			for i := len(recs) - 1; i >= 0; i-- {
				if live(recs[i]) {
					end = i + 1
					break
				}
			}
			if end < 0 || end == len(recs) {
				continue
			}
			// (a use is taken from every instance: the one that let it go
			// first may have seen its last use a little earlier)
			at := recs[end].rec.Timestamp
			if at.Sub(u.last(ref, at, false)) >= idle/2 {
				c.rep.IdleShared++
			}
			continue
		}
		used := u.last(ref, c.logs.End, false)
		by := used.Add(idle + c.o.LetGoLate)
		for _, s := range starts {
			if s.After(used) && !s.After(by) {
				by = latest(by, s.Add(idle+c.o.LetGoLate))
			}
		}
		if !c.logs.End.After(by) {
			continue
		}
		c.rep.IdleShared++
		state, instance := "a state", ""
		if st, err := event.DecodeBreakerState(last.rec.Value); err == nil {
			state, instance = string(st.State), st.Instance
		}
		c.violate("breaker.shared_not_let_go", "", "the breakers topic still shares %s %s (offset %d, written at %s by %s); nothing used the breaker after %s, so it should have been let go, its state tombstoned (idle %s), by %s",
			ref, state, last.rec.Offset, stamp(last.rec.Timestamp), writer(last.rec, instance), stamp(used), idle, stamp(by))
	}
}

// latest is the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
