// Package sweep is the router's expiry and sweep, one part of its data
// path: when a task's state expires (Sweeper.ExpiresAt), the states a batch
// drops as expired (ForgetExpired) and forgets from the store (Forget), and
// the one sweep per batch over the time indexes of the partitions this
// instance owns (Sweep): expiry, due retries and overdue review items. It
// works on the batch through a Batch, asks an Owner which partitions this
// instance owns, and queues its alerts through an alert function (the
// breakers', package hold).
package sweep

// sweep.go is the one sweep over the time indexes of the partitions this
// instance owns: expiring states (expiry.go), due retries and open review
// items past their owner's SLA (the router's review_sla.go). Per batch and partition it
// reads each index only up to what has come due, and decides each task at
// most once, in this order:
//
//   - held retries: those held behind breakers that have all closed since
//     are made due now, in their own due order (package hold, ReleaseHeld,
//     called before the sweep).
//   - expiry: a task past its expiry that the batch's input does not touch
//     is forgotten (a changelog tombstone in the batch's transaction). A
//     task with a pending retry never expires before the retry is
//     published, nor a task with an open review item before it is decided,
//     so a forgotten task has no retry or SLA alert left to raise.
//   - due retries: the task is loaded and touched; the router's publishDue
//     (after the sweep) publishes it unless a breaker holds it.
//   - overdue reviews: one alert per review item, the task touched to
//     record it.
//
// An index entry that no longer matches its task's state is dropped (the
// index lags the state: repair it, never let stale entries starve the sweep).

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/store"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// Batch is the batch a sweep works on: its task states, the tasks its
// input touches, the states it loads and forgets, and its output.
type Batch interface {
	// States are the batch's task states, by ID.
	States() map[string]*task.State
	// Touched reports whether the batch's input touches task id.
	Touched(id string) bool
	// Load makes st, of partition p, one of the batch's states, touched.
	Load(st *task.State, p int32)
	// Remember keeps the index entries of st, a state the batch drops: the
	// next state of its task replaces them.
	Remember(st *task.State)
	// Forgotten reports whether the batch forgets task id (Expire).
	Forgotten(id string) bool
	// Expire makes the batch forget st, of partition p: it queues
	// tombstone, the state's tombstone on the changelog, and the store
	// deletes st once the batch commits (Expired).
	Expire(p int32, st *task.State, tombstone *kgo.Record)
	// Expired are the states the batch forgets.
	Expired() []Expired
	// Queue queues a record on the batch's output.
	Queue(rec *kgo.Record)
}

// Owner tells the partitions this instance owns and runs a repair of the
// store only while no assignment changed them (the router's assignment
// callbacks).
type Owner interface {
	// OwnedPartitions returns the ingress partitions this instance owns.
	OwnedPartitions() []int32
	// RebalanceCount is the count of assignment callbacks run so far.
	RebalanceCount() uint64
	// UnlessRebalanced runs fn under the lock the assignment callbacks
	// hold, if it is free and no callback ran since the count since; else
	// it does nothing.
	UnlessRebalanced(since uint64, fn func() error) error
}

// AlertFunc queues an alert of kind on the batch's output (the breakers'
// alerts topic records, hold.Breakers.Alert).
type AlertFunc func(b Batch, now time.Time, kind string, e event.BreakerEvent)

// Sweeper is the router's expiry and sweep, one part of the data path. It
// owns when a task's state expires (ExpiresAt, expiry.go), the states a
// batch drops as expired (ForgetExpired) and forgets from the store
// (Forget), and the one sweep per batch over the time indexes of the
// partitions this instance owns (Sweep): expiry, due retries and overdue
// review items, whose alerts go out through alert. It reads the store's
// indexes and states, repairs stale index entries only while no rebalance
// ran (Owner), and works on the batch's states. Used by the run loop's
// goroutine only.
type Sweeper struct {
	store      *store.Store
	owner      Owner
	policy     *policy.Policy
	stateTopic string
	log        *slog.Logger
	alert      AlertFunc
}

// New returns the sweep of st, of the partitions owner owns, under policy p;
// stateTopic is the state changelog its tombstones go to.
func New(p *policy.Policy, stateTopic string, log *slog.Logger, st *store.Store, owner Owner, alert AlertFunc) *Sweeper {
	return &Sweeper{store: st, owner: owner, policy: p, stateTopic: stateTopic, log: log, alert: alert}
}

// sweepLimit bounds the entries read from each index per partition and
// batch, so that a backlog is spread over several transactions.
const sweepLimit = 500

// Sweep runs the sweep over the time indexes of the owned partitions: the
// tasks it finds due are the batch's, touched.
func (s *Sweeper) Sweep(b Batch, now time.Time) error {
	nowMs := now.UnixMilli()
	for _, p := range s.owner.OwnedPartitions() {
		err := s.visit(b, store.ExpiryIndex, p, nowMs, func(st *task.State, _ store.Due, inBatch bool) bool {
			if b.Touched(st.TaskID) {
				return true // the batch's input renews it
			}
			// re-check against the state itself: the index is only a hint
			if !expired(st, nowMs) || s.ExpiresAt(st, now) == 0 {
				return false
			}
			b.Expire(p, st, &kgo.Record{Topic: s.stateTopic, Partition: p, Key: []byte(st.TaskID)})
			return true
		})
		if err != nil {
			return err
		}
		err = s.visit(b, store.DueIndex, p, nowMs, func(st *task.State, d store.Due, inBatch bool) bool {
			if !inBatch && !dueMatches(st, d) {
				return false
			}
			b.Load(st, p)
			return true
		})
		if err != nil {
			return err
		}
		err = s.visit(b, store.OverdueIndex, p, nowMs, func(st *task.State, d store.Due, _ bool) bool {
			if st.Review != task.ReviewOpen || st.ReviewAlerted || st.ReviewDueAt != d.NotBefore {
				return false
			}
			b.Load(st, p)
			st.ReviewAlerted = true
			age := time.Duration(nowMs-st.LastSeenAt) * time.Millisecond
			s.alert(b, now, codec.AlertReviewOverdue, event.BreakerEvent{
				Scope: breaker.ScopeTask, Key: st.TaskID, Kind: event.BreakerKindAlert, Class: st.ReviewClass, TaskID: st.TaskID,
				Reason: fmt.Sprintf("review item (%s) open for %s, past the response SLA of owner %s",
					st.ReviewClass, age.Round(time.Second), st.ReviewOwner),
			})
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// dueMatches reports whether a due-index entry is the one of st's pending
// retry.
func dueMatches(st *task.State, d store.Due) bool {
	return st.Pending != nil && st.Pending.NotBefore == d.NotBefore && st.Pending.Due() == d.DueAt
}

// visit reads the entries of index ix of partition p that have come due and
// calls fn with each one's task state: the batch's (inBatch), else the
// store's. fn reports whether the entry matches the state; an entry that
// does not, of a state the batch did not load, is dropped from the index.
// Tasks forgotten earlier in the sweep are skipped.
func (s *Sweeper) visit(b Batch, ix store.Index, p int32, nowMs int64, fn func(st *task.State, e store.Due, inBatch bool) bool) error {
	rebalances := s.owner.RebalanceCount()
	entries, err := s.store.Scan(ix, p, nowMs, sweepLimit)
	if err != nil {
		return err
	}
	if afterIndexScan != nil {
		afterIndexScan(p)
	}
	// the states the batch does not hold, read in one sorted pass
	states := b.States()
	var ids []string
	for _, e := range entries {
		if _, ok := states[e.TaskID]; !ok && !b.Forgotten(e.TaskID) {
			ids = append(ids, e.TaskID)
		}
	}
	stored := make(map[string]*task.State, len(ids))
	if err := s.store.Load(ids, func(string) int32 { return p }, stored); err != nil {
		return err
	}
	var stale []store.Due
	for _, e := range entries {
		if b.Forgotten(e.TaskID) {
			continue
		}
		st, inBatch := states[e.TaskID]
		if !inBatch {
			if st = stored[e.TaskID]; st == nil {
				stale = append(stale, e)
				continue
			}
		}
		if !fn(st, e, inBatch) && !inBatch {
			stale = append(stale, e)
		}
	}
	return s.repair(ix, p, stale, rebalances)
}

// repair drops the stale entries a visit found, unless the store may have
// been restored since the visit read it. The assignment callbacks restore
// and wipe partitions while the run loop routes a batch: a visit that read
// an entry, then found its state gone because a restore had just wiped the
// partition, would delete the same entry the restore then wrote again with
// the state, and the task's retry would never be published. So the repair
// runs only under the lock the callbacks hold (taken only if free: a
// callback may be waiting for this batch's transaction to end) and only if
// no callback ran since the visit's scan (Owner.UnlessRebalanced);
// otherwise the entries stay for a later sweep, which checks them again.
func (s *Sweeper) repair(ix store.Index, p int32, stale []store.Due, rebalances uint64) error {
	if len(stale) == 0 {
		return nil
	}
	if beforeIndexRepair != nil {
		beforeIndexRepair(p)
	}
	return s.owner.UnlessRebalanced(rebalances, func() error { return s.store.DropStale(ix, p, stale) })
}

// afterIndexScan and beforeIndexRepair, when set, run in a visit once its
// index entries are read and before its stale entries are dropped: a test
// runs a restore between them. Nil in production.
var afterIndexScan, beforeIndexRepair func(p int32)
