// Package gcpace paces Go's garbage collector for a router process.
//
// Go collects each time the heap has grown by GOGC percent (100) over what
// the last collection left live. A router's live heap is small while it
// drains a backlog (two batches in flight, the retries it holds), and it
// allocates fast: at GOGC 100 the collector ran so often that marking and
// its assists were about a sixth of the router's CPU an event. Collecting
// half as often (GOGC 200) cut the router's CPU an event by about a tenth
// on make bench's backlog; but with a million live tasks the heap it lets
// grow (three times the live heap) took the process from 452 to 681 MiB.
//
// Tune gets the first without the second: after each collection it sets
// GOGC from the live heap and a budget, so that the heap's next goal is
// the budget, between GOGC 100 (a live heap half the budget or more: Go's
// default, never less) and 200 (a live heap a third of the budget or less).
// The heap then never grows past the larger of the budget and twice the
// live heap: what Go's default lets it reach, or the budget.
//
// Relax lets a restore defer collections for its duration (it holds most
// of what it allocates until its window is written); a relaxation and the
// pacing share one lock, and the pacing waits while a restore is relaxed.
package gcpace

import (
	"os"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultBudget is the heap budget `faultrouter run` paces to
// (--heap-budget-mib): Go's heap goal with a million live tasks is under it
// (make bench's memory run), so that those keep Go's default pacing.
const DefaultBudget = 320 << 20

// The GOGC values Tune sets: between Go's default and twice it.
const (
	minPercent = 100
	maxPercent = 200
	// step is the least change of GOGC Tune makes: setting it stops the
	// world briefly, so it is not set after every collection
	step = 10
)

var pace struct {
	sync.Mutex
	relaxed int // restores relaxed (Relax)
	// tuning: a Tune runs; percent is the GOGC it set last
	tuning  bool
	percent int
	// before Relax: the settings to put back
	limit     int64
	gcPercent int
}

// Percent returns the GOGC that paces a live heap of live bytes to budget
// bytes: budget/live - 1 in percent, between 100 and 200.
func Percent(live, budget int64) int {
	if live <= 0 {
		return maxPercent
	}
	p := (budget - live) * 100 / live
	return int(min(max(p, minPercent), maxPercent))
}

// Tune paces the collector to budget bytes of heap (Percent, after each
// collection) until stop is called, which puts GOGC back as it was. It
// does nothing when the GOGC environment variable is set (the operator
// chose) or budget is 0 or less. One Tune runs at a time.
func Tune(budget int64) (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set || budget <= 0 {
		return func() {}
	}
	pace.Lock()
	if pace.tuning {
		pace.Unlock()
		return func() {}
	}
	pace.tuning = true
	var before int
	if pace.relaxed > 0 { // a restore runs: its undo sets the pacing's start
		before, pace.gcPercent = pace.gcPercent, maxPercent
	} else {
		before = debug.SetGCPercent(maxPercent) // the live heap is small at start
	}
	pace.percent = maxPercent
	pace.Unlock()
	var stopped atomic.Bool
	var arm func()
	arm = func() {
		// a sentinel that the next collection finds unreachable: its
		// finalizer runs once that collection is over
		s := &sentinel{}
		runtime.SetFinalizer(s, func(*sentinel) {
			if stopped.Load() {
				return
			}
			adjust(budget)
			arm()
		})
	}
	arm()
	return func() {
		if stopped.Swap(true) {
			return
		}
		pace.Lock()
		defer pace.Unlock()
		pace.tuning = false
		if pace.relaxed == 0 {
			debug.SetGCPercent(before)
		} else {
			pace.gcPercent = before // what the last relaxation puts back
		}
	}
}

type sentinel struct{ _ *int } // a pointer: not a tiny allocation, which may never be finalized

// adjust sets GOGC from the live heap the last collection left.
func adjust(budget int64) {
	p := Percent(liveHeap(), budget)
	pace.Lock()
	defer pace.Unlock()
	if !pace.tuning || pace.relaxed > 0 {
		return
	}
	if d := p - pace.percent; d >= step || d <= -step || (d != 0 && (p == minPercent || p == maxPercent)) {
		debug.SetGCPercent(p)
		pace.percent = p
	}
}

// liveHeap is the heap the last collection left live, in bytes.
func liveHeap() int64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() == rtmetrics.KindUint64 {
		return int64(s[0].Value.Uint64())
	}
	return 0
}

// Relax lets the heap grow by extra bytes over twice the live heap before
// the collector runs, until undo is called: GOGC off, a memory limit of
// that (or the process's own limit, GOMEMLIMIT, when lower). Relaxations
// at once (restores of routers in one process) share one; the pacing of
// Tune waits until the last is undone.
func Relax(extra int64) (undo func()) {
	pace.Lock()
	defer pace.Unlock()
	if pace.relaxed++; pace.relaxed == 1 {
		live := liveHeap()
		pace.limit = debug.SetMemoryLimit(-1)
		pace.gcPercent = debug.SetGCPercent(-1)
		debug.SetMemoryLimit(min(pace.limit, 2*live+extra))
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pace.Lock()
			defer pace.Unlock()
			if pace.relaxed--; pace.relaxed == 0 {
				debug.SetGCPercent(pace.gcPercent)
				debug.SetMemoryLimit(pace.limit)
			}
		})
	}
}
