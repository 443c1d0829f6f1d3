package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// DecideEvent deduplicates a task event against its task's state and
// decides it with the policy.
//
// An exact redelivery (an event ID in the dedup set) is dropped. A re-driven
// event (faultrouter.redrive.* headers, written by replay --redrive-to) is an
// operator's instruction, not a redelivery, although it carries an event ID
// the task has seen: the task is reopened (task.State.Reopen: a fresh retry
// budget, rate-limit window and usage totals; operations and the dedup set
// stay) and the event is decided afresh, as a new attempt. The decision's
// reason names the re-drive. The re-drive itself is deduplicated by its
// lineage (event ID, source record, count): the same re-drive delivered
// twice is routed once.
func (p *Policy) DecideEvent(ev *event.TaskEvent, st *task.State, rd *event.Redrive, now time.Time) event.Decision {
	isNew := st.TaskID == ""
	if rd == nil {
		if !isNew && st.Seen(ev.EventID) {
			return p.Drop(ev, st, now)
		}
		return p.Decide(ev, st, now)
	}
	key := redriveKey(ev.EventID, rd)
	if !isNew && st.Seen(key) {
		d := p.Drop(ev, st, now)
		d.Reason = fmt.Sprintf("re-drive %d of %s (event %s) was already routed for task %s: exact redelivery, dropped",
			rd.Count, rd.Source(), ev.EventID, ev.TaskID)
		return d
	}
	if !isNew {
		st.Reopen()
	}
	d := p.Decide(ev, st, now)
	st.MarkSeen(key)
	d.Reason = redriveReason(rd, isNew) + d.Reason
	return d
}

// redriveKey is the dedup key of one re-drive of an event.
func redriveKey(eventID string, rd *event.Redrive) string {
	return fmt.Sprintf("%s#redrive:%s:%d", eventID, rd.Source(), rd.Count)
}

func redriveReason(rd *event.Redrive, isNew bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "re-drive %d of %s by an operator", rd.Count, rd.Source())
	if rd.Forced {
		b.WriteString(" (forced)")
	}
	if rd.Reason != "" {
		fmt.Fprintf(&b, " (%s)", rd.ShortReason(256))
	}
	if isNew {
		b.WriteString(": routed as a new task; ")
	} else {
		b.WriteString(": task reopened, routed afresh; ")
	}
	return b.String()
}
