package checker

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// An ordinary OPEN holds everywhere (breaker.open_everywhere). A breaker
// that trips on its failure rate writes its OPEN state to the breakers
// topic in its batch's transaction; every other instance reads it there
// and holds the retries into the breaker until its cooldown, counted from
// the state's opened_at, ends. So once the record is readable (its commit,
// and the end of every transaction before it on the topic: logRec.readable)
// plus openReach, no instance publishes a retry into the breaker before
// opened_at + cooldown, unless a later record of the breaker on the topic
// (its HALF_OPEN, CLOSED or OPEN state from any instance, or a person's
// RESET) was written first: the states are ordered by offsets, and the
// latest one is every instance's. An OPEN derived before a RESET it comes
// after (it names an earlier one, codec.HeaderBreakerAfterReset) holds
// nothing: every instance skips it. A hold with unread offsets between its
// record and its end is not checked.

// openReach bounds how long after an OPEN state becomes readable every
// instance holds its breaker: the topic's delivery and the instance's next
// batch, which applies what the table read before it sweeps the due
// retries (a commit interval: --tick, 200 ms by default, and the batch),
// with room for a loaded machine.
const openReach = 2 * time.Second

// OpenReach is what the open_everywhere check saw.
type OpenReach struct {
	// Opens counts the committed OPEN states of failure-rate breakers on
	// the breakers topic (not latches); Checked those whose cooldown
	// outlasted openReach after they became readable and before a later
	// record of their breaker (the others hold nothing to check), and
	// Unchecked those with unread offsets before their end.
	Opens, Checked, Unchecked int
	// Retries counts the publications of retries into a breaker compared
	// with its holds, and Held the retries that came due while a hold of
	// another instance's OPEN held them.
	Retries, Held int
}

func (o OpenReach) String() string {
	return fmt.Sprintf("%d OPEN states of failure-rate breakers, %d held past %s after they were readable (%d unchecked); %d retry publications compared, %d retries due while another instance's OPEN held them",
		o.Opens, o.Checked, openReach, o.Unchecked, o.Retries, o.Held)
}

// openHold is one OPEN state's hold on its breaker: from readable plus
// openReach until the earlier of its cooldown's end and the time the next
// record of the breaker was written.
type openHold struct {
	offset   int64
	by       string
	from, to time.Time
	opened   time.Time
	endedBy  string
}

// openEverywhere checks every retry publication against the holds of the
// failure-rate OPEN states on the breakers topic. Without a breakers topic
// (Logs.Breakers nil) it checks nothing.
func (c *checker) openEverywhere() {
	if c.logs.Breakers == nil {
		return
	}
	holds := c.openHolds()
	for _, xs := range c.retries {
		for _, x := range xs {
			for _, ref := range x.refs {
				if hs := holds[ref]; len(hs) > 0 {
					c.retryInOpen(x, ref, hs)
				}
			}
		}
	}
}

// retryInOpen checks each publication of retry x into ref against the
// holds of ref's OPEN states (reporting it once), and counts x when it
// came due while another instance's OPEN held it.
func (c *checker) retryInOpen(x *expectRetry, ref breaker.Ref, holds []openHold) {
	for _, p := range x.published {
		at, inst := p.at(), c.instanceOf(p.rec.ProducerID)
		if !c.sharesLatches(inst, at) {
			continue
		}
		c.rep.Open.Retries++
		if i := slices.IndexFunc(holds, func(h openHold) bool { return h.holding(at) }); i >= 0 {
			h := holds[i]
			c.violate("breaker.open_everywhere", x.task, "retry n=%d published at %s on instance %s into %s, held by the OPEN state at offset %d of the breakers topic "+
				"(written by %s, opened %s, held everywhere from %s until %s, %s)",
				x.n, stamp(at), inst, ref, h.offset, h.by, stamp(h.opened), stamp(h.from), stamp(h.to), h.endedBy)
			return
		}
	}
	due := x.notBefore
	if x.decided.After(due) {
		due = x.decided
	}
	if x.input == nil || x.input.audit == nil {
		return
	}
	by := c.instanceOf(x.input.audit.rec.ProducerID)
	if slices.ContainsFunc(holds, func(h openHold) bool { return h.by != by && h.holding(due) }) {
		c.rep.Open.Held++
	}
}

// holding reports whether h held its breaker on every instance at t.
func (h openHold) holding(t time.Time) bool {
	return !t.Before(h.from) && t.Before(h.to)
}

// openHolds reads the failure-rate OPEN states of the breakers topic and
// returns, per breaker, the holds that outlast openReach.
func (c *checker) openHolds() map[breaker.Ref][]openHold {
	out := map[breaker.Ref][]openHold{}
	l := readBreakerLog(c.logs.Breakers)
	lastReset := map[string]int64{} // by RESET key: the offset of the last RESET read so far
	for i, r := range l.recs {
		key := string(r.rec.Key)
		if strings.HasPrefix(key, event.BreakerResetPrefix) && r.rec.Value != nil && !r.committed.IsZero() && r.rec.Partition == 0 {
			lastReset[key] = r.rec.Offset
		}
		if r.rec.Value == nil || r.committed.IsZero() || strings.HasPrefix(key, event.BreakerItemPrefix) || strings.HasPrefix(key, event.BreakerResetPrefix) {
			continue
		}
		sc, k, ok := event.ParseBreakerKey(key)
		scope, err := breaker.ParseScope(sc)
		s, derr := event.DecodeBreakerState(r.rec.Value)
		if !ok || err != nil || derr != nil || s.State != breaker.Open.Name() || s.Latched {
			continue
		}
		by := writer(r.rec, s.Instance)
		if !c.sharesLatches(by, r.rec.Timestamp) {
			continue
		}
		if h := codec.ParseBreakerHeaders(r.rec.Headers); h.AfterResetKnown {
			if at, reset := lastReset[event.BreakerResetKey(sc, k)]; reset && h.AfterReset < at {
				continue // derived before the RESET it comes after: it holds nothing
			}
		}
		c.rep.Open.Opens++
		if r.readable.IsZero() {
			continue
		}
		ref := breaker.Ref{Scope: scope, Key: k}
		cooldown := c.breakerConfig(ref).Cooldown
		h := openHold{offset: r.rec.Offset, by: by, opened: s.OpenedAt.Time, from: r.readable.Add(openReach), endedBy: "its cooldown ended"}
		h.to = h.opened.Add(cooldown)
		end := int64(1<<63 - 1)
		resetKey := event.BreakerResetKey(sc, k)
		for _, n := range l.recs[i+1:] {
			nk := string(n.rec.Key)
			if nk != key && (nk != resetKey || n.rec.Value == nil) {
				continue
			}
			end = n.order
			if n.rec.Timestamp.Before(h.to) {
				h.to = n.rec.Timestamp
				h.endedBy = "ended by the record at offset " + strconv.FormatInt(n.rec.Offset, 10) + " by " + writer(n.rec, "")
			}
			break
		}
		if !h.from.Before(h.to) {
			continue
		}
		if l.gapIn(r.order, end) {
			c.rep.Open.Unchecked++
			continue
		}
		c.rep.Open.Checked++
		out[ref] = append(out[ref], h)
	}
	return out
}
