package sweep

// TTL of task state.
//
// A task's state expires 2 x SLA after its last event, on the router clock
// (the event's sla_ms, else the policy's default_sla_ms). While one of its
// WRITE operations is SUBMITTED or UNKNOWN the state never expires: only a
// receipt, a person or a reconciliation resolves it, because an expired dedup
// window must never let a lost-receipt write run again. While a review item
// is open the state never expires either: the item lives until a person
// decides it (an owner's response SLA may be far longer than 2 x the task's
// SLA, 72 h against 48 h by default), its overdue alert fires when the
// owner's SLA passes, and the decision, however late, is applied; the state
// then expires 2 x SLA after the decision. While a retry is
// pending the state does not expire either: its expiry counts from the
// retry's due time (a 429 may ask for a wait longer than 2 x SLA; the policy
// caps that wait at rate_limited.max_retry_after_ms), so the retry is always
// published, and audited, before its task can be forgotten. A retry that
// breakers still hold 2 x SLA after its own due time is given up to the
// dead-letter topic instead (policy.HeldRetryExpiry; publishDue), and its
// task then expires 2 x SLA later.
//
// How it runs, per poll batch:
//
//   - ForgetExpired (right after the batch's states are loaded): a loaded
//     state whose ExpiresAt has passed is treated as absent, so an event
//     arriving after expiry never sees it, whether or not the sweep below has
//     deleted it yet.
//   - the sweep (sweep.go, after the batch's input is decided): for each
//     partition this instance owns, reads that partition's expiry index
//     (hour buckets that lie wholly in the past, never the whole store), and
//     for each task whose state is past its ExpiresAt and that the batch does
//     not touch, queues a tombstone on the state changelog in the batch's
//     transaction, before the same sweep looks at due retries and overdue
//     review items, which then skip the task. An index entry that no longer
//     matches its state is dropped, so stale entries cannot stall the sweep.
//     The changelog record of every state the batch changes carries its new
//     ExpiresAt (changelog, in handle.go), so a restore rebuilds the same
//     expiry index.
//   - Forget (in persist, after the transaction committed): deletes those
//     states and their index entries from Pebble.
//
// An event that arrives after its task expired starts a fresh state: a new
// task history, attempt and retry counts from zero, a new retry budget, no
// memory of the event IDs seen before. So an exact redelivery of an event
// older than 2 x SLA is routed again instead of dropped, and an event for a
// task that ended long ago is decided on its own instead of being a
// DUPLICATE_EXECUTION. That is the price of bounded state, and the reason
// unresolved WRITE operations and open review items never expire. A review
// decision for a task that expired after its item was decided finds no open
// item: it is audited (review.no_open_item) and changes nothing.
//
// Expired entries of partitions another instance owns are left to that
// instance (its tombstone reaches this store through the changelog when the
// partition comes back); the index is keyed by partition first, so they are
// never read here.

import (
	"time"

	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Expired is a state the TTL forgets once the batch's transaction commits.
type Expired struct {
	Partition int32
	State     *task.State // as the store holds it: names its index entries
}

// expired reports whether st is past its expiry at nowMs. A task with a
// pending retry never is: the retry is published first (expiresAt counts
// from its due time). Nor is a task with an open review item: the item lives
// until a person decides it. Both checks also cover a state stamped with an
// ExpiresAt before those rules.
func expired(st *task.State, nowMs int64) bool {
	return st.ExpiresAt > 0 && st.ExpiresAt <= nowMs && st.Pending == nil && st.Review != task.ReviewOpen
}

// ForgetExpired drops from the batch the loaded states that have expired, so
// that events for them start fresh. Their index entries are remembered: the
// fresh state's Put replaces them, or the sweep deletes them.
func (s *Sweeper) ForgetExpired(b Batch, now time.Time) {
	nowMs := now.UnixMilli()
	states := b.States()
	for id, st := range states {
		if !expired(st, nowMs) {
			continue
		}
		b.Remember(st)
		delete(states, id)
		s.log.Info("state expired; a new event starts a fresh task history", "task_id", id, "expired_at", st.ExpiresAt)
	}
}

// Forget deletes the expired states of the committed batch from the store.
func (s *Sweeper) Forget(wb *store.Batch, b Batch) error {
	for _, x := range b.Expired() {
		if err := wb.Delete(x.Partition, x.State); err != nil {
			return err
		}
		s.log.Info("state expired and forgotten", "task_id", x.State.TaskID, "topic", s.stateTopic,
			"partition", x.Partition, "expired_at", x.State.ExpiresAt)
	}
	return nil
}

// ExpiresAt is when a task's state may be forgotten: 2 x SLA after its last
// event on the router clock, or never while an operation's outcome is unknown
// or a review item is open. A pending retry moves it to 2 x SLA after the
// retry's due time, so that the retry is published before its task can
// expire (expiry.go).
func (s *Sweeper) ExpiresAt(st *task.State, now time.Time) int64 {
	if st.Review == task.ReviewOpen {
		return 0
	}
	for _, op := range st.Operations {
		if op.Kind == event.OpWrite && (op.State == event.OpSubmitted || op.State == event.OpUnknown) {
			return 0
		}
	}
	sla := st.SLAMs
	if sla <= 0 {
		sla = s.policy.DefaultSLAMs
	}
	from := now.UnixMilli()
	if st.Pending != nil {
		from = max(from, st.Pending.NotBefore)
	}
	return from + 2*sla
}
