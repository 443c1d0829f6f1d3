package breaker

import "time"

// Window is the rolling failure window of one breaker, on its own: the
// counting a Set does for each of its breakers (Record), without the states
// around it. A breaker's window starts empty and is emptied each time the
// breaker closes; a checker that knows which outcomes one instance saw since
// then recomputes with it whether the breaker had to open.
type Window struct {
	cfg   Config
	slots [buckets]slot
}

// NewWindow returns an empty window of cfg (its Window, MinRequests and
// FailureRatio are what count).
func NewWindow(cfg Config) *Window { return &Window{cfg: cfg} }

// Add counts one outcome at now.
func (w *Window) Add(now time.Time, failure bool) {
	countSlots(&w.slots, w.cfg.Window, now.UnixMilli(), failure)
}

// Counts sums the window ending at now.
func (w *Window) Counts(now time.Time) (failures, requests int32) {
	return sumSlots(&w.slots, w.cfg.Window, now.UnixMilli())
}

// Trips reports whether a failure that leaves a CLOSED breaker's window at
// failures of requests opens it: at least MinRequests outcomes, of which at
// least FailureRatio failed.
func (c Config) Trips(failures, requests int32) bool {
	return requests >= c.MinRequests && float64(failures) >= c.FailureRatio*float64(requests)
}

// sumSlots sums the slots of a window of width window ending at now (ms).
func sumSlots(slots *[buckets]slot, window time.Duration, now int64) (fail, req int32) {
	w := window.Milliseconds()
	for _, sl := range slots {
		if sl.start != 0 && sl.start > now-w {
			fail += sl.fail
			req += sl.requests
		}
	}
	return fail, req
}

// countSlots counts one outcome at now (ms) in the slots of a window of
// width window.
func countSlots(slots *[buckets]slot, window time.Duration, now int64, failure bool) {
	width := max(window.Milliseconds()/buckets, 1)
	start := now / width * width
	sl := &slots[(now/width)%buckets]
	if sl.start != start {
		*sl = slot{start: start}
	}
	sl.requests++
	if failure {
		sl.fail++
	}
}
