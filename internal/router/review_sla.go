package router

// review_sla.go raises an alert when a review item stays open past its
// owner's response SLA (the policy's owners section), and when a write whose
// outcome is unknown waits for reconciliation that long: such a task is in
// review too. The deadline is kept in the task state and in a per-partition
// time index in Pebble, so the sweep (package sweep) reads only what is overdue. One alert
// per review item; it is a BreakerEvent of scope TASK and kind ALERT on the
// alerts topic, in the transaction of the batch that found it.

import (
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// trackReview starts the owner's SLA clock when a decision opens a review
// item, and stops it when the item closes.
func (r *Router) trackReview(st *task.State, d *event.Decision, now time.Time) {
	if st.Review != task.ReviewOpen {
		st.ReviewOwner, st.ReviewDueAt, st.ReviewAlerted = "", 0, false
		return
	}
	if st.ReviewDueAt == 0 && d.Review != nil && d.Review.SLAMs > 0 {
		st.ReviewOwner = d.Review.Owner
		st.ReviewDueAt = now.UnixMilli() + d.Review.SLAMs
		st.ReviewAlerted = false
	}
}
