// Package checker is faultrouter's reference-model checker. It reads the
// committed logs of one run (the input topics and every output topic, read
// with read_committed) and recomputes, task by task, what the router must
// have written, with the product's own pure policy (pkg/policy) applied to
// each task's inputs in the order the router decided them, the task state
// carried along. It then checks the outputs exactly:
//
//   - one audit record per input offset, with the class, route, rule,
//     reason, retry plan, totals and review the model computes, and the
//     name of the policy override it was decided under (the most specific
//     override matching the event, as pkg/policy resolves it; none when the
//     base policy decided);
//   - every retry published exactly once, at or after its due time, with the
//     event it re-issues; a retry that a later decision of the task
//     superseded is published at most once, before that decision; a retry
//     that breakers held until its task's lifetime ended (2 x SLA after its
//     due time) may instead be given up, once, to the dead-letter topic
//     (rule retry.held_expired), never earlier and never while it could
//     have been published;
//   - every review and dead-letter record present, and no extra one;
//   - every alert present (hallucination, budget, review SLA: every open
//     item past its owner's SLA, however long it stays open) and no extra
//     one; surge alerts justified by the audit stream;
//   - the state changelog's tombstones: none while the task could not
//     expire, one for every task past its expiry;
//   - every input on another partition than its task's (Options.Partitions)
//     audited as forwarded and copied once, unchanged, to its task's
//     partition (forward.go);
//   - breaker transitions consistent with the audit stream, per router
//     instance (breakers live in one instance's memory): each transition
//     starts where the previous one ended, an outcome-driven transition names
//     a decision of that class at that time, every hallucination latch has
//     its alert, no retry is published into an open breaker, a half-open
//     breaker lets at most its probes through, the retries held behind a
//     breaker come out in due order once it closes, and a latched template
//     reopens (at a reviewer's decision, a RESET, the last item decided
//     elsewhere) only when no other item of it holds it in the breakers
//     topic's order (transitions adopted from another instance and latches
//     are told by their faultrouter.breaker.* headers); a breaker that
//     nothing used anywhere for its idle time is let go, and its OPEN or
//     HALF_OPEN state tombstoned on the breakers topic within
//     Options.LetGoLate after that, so that an instance that starts does not
//     adopt it again (letgo.go: breaker.not_let_go,
//     breaker.shared_not_let_go);
//   - a latch holds everywhere, in the breakers topic's order (Logs.Breakers,
//     breakerlog.go, latchreach.go): once the transaction that wrote a
//     hallucination's latch item committed, no instance publishes a retry
//     into its template later than 5 s after, until a later record ends
//     the item: its tombstone, or a RESET of the template written after it
//     (a higher offset), never one written before it, whatever the clocks
//     say; every hallucination that latches wrote its item, and every
//     reviewer's decision of one its tombstone;
//   - a record the router forwarded to its task's partition (its copy names
//     it in faultrouter.forwarded.from) is audited partition.forward, and the
//     copy is the input the task's model follows;
//   - breakers that had to open and surges that had to fire (missing.go):
//     each process's breaker windows and surge detector are recomputed with
//     pkg/breaker from the decisions its audit records (by producer ID)
//     attribute to it; within a stretch of time a breaker was CLOSED there,
//     the batch after which its window trips whatever the order of the
//     batch's outcomes must end the stretch with a transition
//     (breaker.missing_open), and after a batch that leaves a watched class
//     at min_events and the ratio the process must have alerted that surge
//     since the key's window was last empty (surge.missing). The bound is
//     sound, not exact: a batch's order is not in the logs, outcomes decided
//     in the millisecond a breaker closed count as successes only, and a
//     window with decisions of no known instance is not checked;
//   - a task event too large to be routed under the smallest output topic's
//     limit (Options.MaxOutputBytes) is dead-lettered once with its
//     faultrouter.error.* headers at stage write, audited INVALID_INPUT
//     output.too_large, with no other output, and its partition routes on
//     (unwritable.go);
//   - the cost ledger: the spend, failed spend and cost prevented that
//     `faultrouter cost` sums from the audit records equal the sums of the
//     model's decisions, in total and per class.
//
// Time. The policy reads the router's clock (due times, the review SLA
// clock). The model takes each decision's time from its audit record and
// checks that it lies within the input's commit window: not before the input
// was produced, at most Options.DecideLate after it, not after the logs were
// read, never earlier than the task's previous decision. It keeps each
// task's state for 2 x its SLA after its last decision or retry
// publication, but never while a review item is open, a write's outcome is
// unknown (until a receipt, or a reviewer's decision of the OUTCOME_UNKNOWN
// item, which the model records itself) or a retry is pending; an input
// after expiry is decided on a fresh state, and the state changelog's
// tombstones must agree (lifetime.go). Every published retry comes out at
// most Options.RetryLate after it could (its due time, or the close of a
// breaker that held it).
//
// Order. A task's inputs come from two topics (ingress and decisions). The
// model takes their order from the committed input log, each topic's in
// offset order, the two merged by decision time, and checks that the audit
// records agree.
//
// The checker shares no code with the router's batching, store or
// transactions: it decodes with pkg/codec, decides with pkg/policy and
// carries pkg/task states of its own. Check returns a Report: a summary, the
// violations, and the first task whose outputs differ with its inputs, the
// expected outputs and the actual ones.
package checker
