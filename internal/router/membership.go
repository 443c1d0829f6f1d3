package router

// membership.go is how an instance leaves the consumer group. A dynamic
// member leaves when its session's client closes (franz-go sends the
// LeaveGroup), so the group moves its partitions at once. A static member
// (Config.StaticMembership) does not: franz-go keeps it in the group so
// that a restart with the same instance ID takes its partitions back
// without a rebalance, and until then, up to the session timeout, nobody
// routes them. On a clean shutdown (Run's context done) the router sends
// the leave itself, by instance ID, after the session's client closed: its
// last transaction is aborted and its partitions marked released by then
// (onRevoked), so the members that take them over restore what it
// committed. A session that ends on an error is not left: the next session
// rejoins under the same instance ID and gets its partitions back.
//
// The leave is never sent from an assignment callback: franz-go's group
// management waits for the callback to return, and a leave waits for the
// group management (a deadlock).

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

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
