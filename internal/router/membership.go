package router

// membership.go is how an instance leaves the consumer group. A dynamic
// member leaves when its session's client closes (franz-go sends the
// LeaveGroup), so the group moves its partitions at once. A static member
// (Config.StaticMembership) does not: franz-go keeps it in the group so
// that a restart with the same instance ID takes its partitions back
// without a rebalance, and until then, up to the session timeout, nobody
// routes them. On a clean shutdown (Run's context done) the router sends
// the leave itself, by instance ID, after the session's client closed: its
// last batch is committed (drainContext), any transaction still open
// aborted and its partitions marked released by then (onRevoked), so the
// members that take them over restore what it committed. A session that ends on an error is not left: the next session
// rejoins under the same instance ID and gets its partitions back.
//
// A static member that died (SIGKILL, a node lost) leaves its last
// transaction open: the state changelog's last stable offset, and the
// offset fetch of its partitions, wait until the broker aborts it, up to the
// transaction timeout plus the broker's cleanup interval after it began,
// longer than the session timeout. So on each assignment a static member
// fences the transactional ID of every instance that was a member at its
// last assignment, is no longer one, and has a transaction open
// (fenceDeparted): the InitProducerID aborts that transaction at once, and
// the restore of the partitions it owned need not wait for it. An instance
// fenced while it was only paused is a zombie whose next transaction fails,
// as its session already did.
//
// The leave is never sent from an assignment callback: franz-go's group
// management waits for the callback to return, and a leave waits for the
// group management (a deadlock).

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A rebalance goes on until every member has rejoined, and a member learns
// of it at its next heartbeat. In the cooperative protocol (balancer.go) a
// partition that moves from one member to another waits for two such
// rounds (its owner revokes it in the first, the other gets it in the
// second), and each member's transaction that ends while it rejoins waits
// for the join too (franz-go's transactional session heartbeats before it
// commits). So heartbeats go every heartbeatMax (a tenth of the session
// timeout where that is shorter), not a tenth of the session timeout: a
// few dozen small requests a second to the coordinator from each instance
// buy rounds of tens of milliseconds instead of a second. (20 ms shortened
// a rolling restart's rounds further in the benchmark, for two and a half
// times the requests; 50 ms already keeps the restart's p99 within the
// goal, so it is not taken.) The member that gets the
// partitions moved does not wait for a heartbeat to learn of the second
// round: it starts it (rejoinForPending). The session timeout, not the
// interval, decides when a silent member expires.
const heartbeatMax = 50 * time.Millisecond

// heartbeatInterval is the group heartbeat interval for a session timeout.
func heartbeatInterval(session time.Duration) time.Duration {
	return min(heartbeatMax, session/10)
}

// metadataMinAge is the least time between two metadata reads of the
// session's client. A partition assigned, and every partition whose
// transaction aborted (the session resets it to its committed offset),
// is fetched again only once its leader's epoch is checked against a
// fresh metadata read: franz-go's default, 5 s, could hold it that long,
// and 250 ms still held a moved partition for a quarter of a second in a
// deploy. Reads are throttled to one per metadataMinAge of each client.
const metadataMinAge = 50 * time.Millisecond

// fetchMaxWait is how long the broker may hold a fetch of the session's
// client that finds no new records. franz-go keeps one fetch in flight per
// broker and adds partitions assigned meanwhile only to the next one, so
// after a rebalance the partitions whose offsets were loaded last waited
// for a fetch of the others, which had no new records, for franz-go's
// default of 5 s: a deploy's or a crash's partitions decided nothing for
// 5 s more in a third of the runs. Kafka's own consumer waits 500 ms. At
// 200 ms, a partition that a rolling restart moved still waited up to a
// fifth of a second behind a fetch already in flight (restart p99 93-111
// ms against 66-93 at 50 ms, fleet runs alternated on fresh brokers); the
// router waits 50 ms, twenty fetches a second from an idle instance (a
// fetch with records returns at once either way).
const fetchMaxWait = 50 * time.Millisecond

// leaveTimeout bounds the leave on shutdown; a leave that does not get
// through leaves the partitions to the session timeout.
const leaveTimeout = 5 * time.Second

// leaveStatic sends a static member's LeaveGroup on shutdown (see above);
// a dynamic member left when its client closed.
func (r *Router) leaveStatic() {
	if !r.cfg.StaticMembership {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	cl, err := kgo.NewClient(r.cfg.ClientOpts...)
	if err != nil {
		r.log.Warn("leaving the group: client", "group", r.cfg.Group, "err", err)
		return
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).LeaveGroup(ctx, kadm.LeaveGroup(r.cfg.Group).InstanceIDs(r.cfg.InstanceID).Reason("shutdown"))
	if err == nil {
		err = resp.Error()
	}
	switch {
	case err == nil:
		r.log.Info("left the group", "group", r.cfg.Group, "group_instance_id", r.cfg.InstanceID)
	case errors.Is(err, kerr.UnknownMemberID):
		// never joined, or expired already: nothing to hand over
	default:
		r.log.Warn("leaving the group failed: its partitions move when the session times out",
			"group", r.cfg.Group, "group_instance_id", r.cfg.InstanceID, "session_timeout", r.cfg.SessionTimeout, "err", err)
	}
}

// fenceTimeout bounds fenceDeparted; what it did not fence the broker
// aborts at the transaction timeout.
const fenceTimeout = 10 * time.Second

// fenceDeparted aborts the open transactions of the static members that
// left the group since the last assignment without ending them (see
// above). It runs in the assignment callback before the restore; it only
// reads the group and writes with other clients, never the session's group.
func (r *Router) fenceDeparted(ctx context.Context, cl *kgo.Client) {
	if !r.cfg.StaticMembership {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
	defer cancel()
	adm := kadm.NewClient(cl)
	described, err := adm.DescribeGroups(ctx, r.cfg.Group)
	if err != nil || described.Error() != nil {
		r.log.Debug("fencing departed members: describe group", "group", r.cfg.Group, "err", errors.Join(err, described.Error()))
		return
	}
	members := map[string]bool{}
	for _, m := range described[r.cfg.Group].Members {
		if m.InstanceID != nil {
			members[*m.InstanceID] = true
		}
	}
	var departed []string
	for id := range r.knownMembers {
		if !members[id] && id != r.cfg.InstanceID {
			departed = append(departed, id)
		}
	}
	r.knownMembers = members
	if len(departed) == 0 {
		return
	}
	open, err := adm.ListTransactions(ctx, nil, []string{"Ongoing"})
	if err != nil {
		r.log.Warn("fencing departed members: list transactions (their open transactions are aborted at the transaction timeout)",
			"departed", departed, "err", err)
		return
	}
	prefix := r.cfg.Group + "-"
	for _, id := range slices.Sorted(slices.Values(departed)) {
		txnID := prefix + id
		if _, ok := open[txnID]; !ok {
			continue
		}
		start := time.Now()
		if err := fenceTransactionalID(ctx, r.cfg.ClientOpts, txnID); err != nil {
			r.log.Warn("fencing a departed member's open transaction failed: it is aborted at the transaction timeout",
				"group_instance_id", id, "transactional_id", txnID, "err", err)
			continue
		}
		r.log.Info("fenced the open transaction of a member that left the group without ending it",
			"group_instance_id", id, "transactional_id", txnID, "took", time.Since(start).Round(time.Millisecond),
			"members", slices.Sorted(maps.Keys(members)))
	}
}

// fenceTransactionalID initializes a producer under txnID: the broker
// bumps its epoch and aborts its open transaction.
func fenceTransactionalID(ctx context.Context, opts []kgo.Opt, txnID string) error {
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), kgo.TransactionalID(txnID))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	_, _, err = cl.ProducerID(ctx)
	return err
}
