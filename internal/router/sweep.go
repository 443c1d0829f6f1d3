package router

// sweep.go is the one sweep over the time indexes of the partitions this
// instance owns: expiring states (expiry.go), due retries and open review
// items past their owner's SLA (review_sla.go). Per batch and partition it
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
//   - due retries: the task is loaded and touched; publishDue (decide.go,
//     after the sweep) publishes it unless a breaker holds it.
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

// sweeper is the router's expiry and sweep, one part of the data path. It
// owns when a task's state expires (expiresAt, expiry.go), the states a
// batch drops as expired (forgetExpired) and forgets from the store
// (forget), and the one sweep per batch over the time indexes of the
// partitions this instance owns (sweep): expiry, due retries and overdue
// review items, whose alerts go out through the breakers' alerts (an
// alerter). It reads the store's indexes and states, repairs stale index
// entries only while no rebalance ran (assignment), and works on the
// batch's states. Used by the run loop's goroutine only.
type sweeper struct {
	store      *store.Store
	owner      assignment
	policy     *policy.Policy
	stateTopic string
	log        *slog.Logger
	alerts     alerter
}

func newSweeper(cfg *Config, log *slog.Logger, st *store.Store, owner assignment, alerts alerter) sweeper {
	return sweeper{store: st, owner: owner, policy: cfg.Policy, stateTopic: cfg.Topics.State, log: log, alerts: alerts}
}

// sweepLimit bounds the entries read from each index per partition and
// batch, so that a backlog is spread over several transactions.
const sweepLimit = 500

// sweep runs the sweep over the time indexes of the owned partitions: the
// tasks it finds due are the batch's, touched.
func (s *sweeper) sweep(b *batch, now time.Time) error {
	nowMs := now.UnixMilli()
	for _, p := range s.owner.ownedPartitions() {
		err := s.visit(b, store.ExpiryIndex, p, nowMs, func(st *task.State, _ store.Due, inBatch bool) bool {
			if b.isTouched[st.TaskID] {
				return true // the batch's input renews it
			}
			// re-check against the state itself: the index is only a hint
			if !expired(st, nowMs) || s.expiresAt(st, now) == 0 {
				return false
			}
			b.forgotten[st.TaskID] = true
			b.out = append(b.out, &kgo.Record{Topic: s.stateTopic, Partition: p, Key: []byte(st.TaskID)})
			b.expired = append(b.expired, expiredTask{partition: p, state: st})
			return true
		})
		if err != nil {
			return err
		}
		err = s.visit(b, store.DueIndex, p, nowMs, func(st *task.State, d store.Due, inBatch bool) bool {
			if !inBatch && !dueMatches(st, d) {
				return false
			}
			b.load(st, p)
			return true
		})
		if err != nil {
			return err
		}
		err = s.visit(b, store.OverdueIndex, p, nowMs, func(st *task.State, d store.Due, _ bool) bool {
			if st.Review != task.ReviewOpen || st.ReviewAlerted || st.ReviewDueAt != d.NotBefore {
				return false
			}
			b.load(st, p)
			st.ReviewAlerted = true
			age := time.Duration(nowMs-st.LastSeenAt) * time.Millisecond
			s.alerts.Alert(b, now, codec.AlertReviewOverdue, event.BreakerEvent{
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
func (s *sweeper) visit(b *batch, ix store.Index, p int32, nowMs int64, fn func(st *task.State, e store.Due, inBatch bool) bool) error {
	rebalances := s.owner.rebalanceCount()
	entries, err := s.store.Scan(ix, p, nowMs, sweepLimit)
	if err != nil {
		return err
	}
	if afterIndexScan != nil {
		afterIndexScan(p)
	}
	// the states the batch does not hold, read in one sorted pass
	var ids []string
	for _, e := range entries {
		if _, ok := b.states[e.TaskID]; !ok && !b.forgotten[e.TaskID] {
			ids = append(ids, e.TaskID)
		}
	}
	stored := make(map[string]*task.State, len(ids))
	if err := s.store.Load(ids, func(string) int32 { return p }, stored); err != nil {
		return err
	}
	var stale []store.Due
	for _, e := range entries {
		if b.forgotten[e.TaskID] {
			continue
		}
		st, inBatch := b.states[e.TaskID]
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
// no callback ran since the visit's scan (assignment.unlessRebalanced);
// otherwise the entries stay for a later sweep, which checks them again.
func (s *sweeper) repair(ix store.Index, p int32, stale []store.Due, rebalances uint64) error {
	if len(stale) == 0 {
		return nil
	}
	if beforeIndexRepair != nil {
		beforeIndexRepair(p)
	}
	return s.owner.unlessRebalanced(rebalances, func() error { return s.store.DropStale(ix, p, stale) })
}

// afterIndexScan and beforeIndexRepair, when set, run in a visit once its
// index entries are read and before its stale entries are dropped: a test
// runs a restore between them. Nil in production.
var afterIndexScan, beforeIndexRepair func(p int32)
