package checker

import (
	"slices"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
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
	points := map[breaker.Ref][]time.Time{}   // uses at an instant
	spans := map[breaker.Ref][][2]time.Time{} // uses over a stretch: a retry held behind it is asked again and again
	for _, in := range c.inputs {
		if in.kind != inTask || in.audit == nil {
			continue
		}
		at := in.audit.at()
		for _, ref := range policy.BreakerRefs(&in.event) {
			points[ref] = append(points[ref], at)
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
				spans[ref] = append(spans[ref], [2]time.Time{x.decided, end})
			}
		}
	}
	for _, t := range ts {
		if sc, err := breaker.ParseScope(t.e.Scope); err == nil {
			ref := breaker.Ref{Scope: sc, Key: t.e.Key}
			points[ref] = append(points[ref], t.e.At.Time)
		}
	}
	for _, r := range c.logs.Breakers {
		scope, key, ok := strings.Cut(string(r.Key), "/")
		if !ok || scope == "item" {
			continue
		}
		if scope == "reset" {
			if scope, key, ok = strings.Cut(key, "/"); !ok {
				continue
			}
		}
		if sc, err := breaker.ParseScope(event.BreakerScope(scope)); err == nil {
			ref := breaker.Ref{Scope: sc, Key: key}
			points[ref] = append(points[ref], r.Timestamp)
		}
	}
	// lastUse is the last use of ref before t (the transition that ends a
	// stretch at t is no use of it)
	lastUse := func(ref breaker.Ref, t time.Time) time.Time {
		var last time.Time
		for _, p := range points[ref] {
			if p.Before(t) && p.After(last) {
				last = p
			}
		}
		for _, s := range spans[ref] {
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
			for _, st := range c.o.Starts[k.instance] {
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
}
