package router

// review_sla.go raises an alert when a review item stays open past its
// owner's response SLA (the policy's owners section), and when a write whose
// outcome is unknown waits for reconciliation that long: such a task is in
// review too. The deadline is kept in the task state and in a per-partition
// time index in Pebble, so the sweep reads only what is overdue. One alert
// per review item; it is a BreakerEvent of scope TASK and kind ALERT on the
// alerts topic, in the transaction of the batch that found it.

import (
	"fmt"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/store"
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

// overdueReviews queues one alert for every open review item on the
// partitions this instance owns whose owner's SLA has passed.
func (r *Router) overdueReviews(b *batch, now time.Time) error {
	nowMs := now.UnixMilli()
	for _, p := range r.ownedPartitions() {
		due, err := r.store.Overdue(p, nowMs, 500)
		if err != nil {
			return err
		}
		var stale []store.Due
		for _, d := range due {
			st, ok := b.states[d.TaskID]
			if !ok {
				if st, err = r.store.Get(d.TaskID); err != nil {
					return err
				}
				if st == nil {
					stale = append(stale, d)
					continue
				}
				b.states[d.TaskID] = st
				b.remember(st)
			}
			if st.Review != task.ReviewOpen || st.ReviewAlerted || st.ReviewDueAt != d.NotBefore {
				if !ok {
					stale = append(stale, d) // the index lags its state: repair
				}
				continue
			}
			st.ReviewAlerted = true
			b.touch(d.TaskID, p)
			age := time.Duration(nowMs-st.LastSeenAt) * time.Millisecond
			r.alert(b, now, event.BreakerEvent{
				Scope: scopeTask, Key: st.TaskID, Kind: breakerKindAlert, Class: st.ReviewClass, TaskID: st.TaskID,
				Reason: fmt.Sprintf("review item (%s) open for %s, past the response SLA of owner %s",
					st.ReviewClass, age.Round(time.Second), st.ReviewOwner),
			})
		}
		if err := r.store.DropOverdue(p, stale); err != nil {
			return err
		}
	}
	return nil
}
