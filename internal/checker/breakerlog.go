package checker

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// The breakers topic is the authority for latches (internal/latch): a
// prompt template is latched exactly while one of its items is open whose
// record's offset is above the offset of the template's last RESET record.
// An item record (event.BreakerItem, keyed "item/<scope>/<task>/<key>")
// opens an item, its tombstone ends it; a RESET record (keyed
// "reset/<scope>/<key>") ends every item of its breaker written before it
// (lower offsets) and none written after. The topic has one partition, so
// its offsets order every record. No writer's clock orders anything.
//
// The checker reads the topic as Logs.Breakers gives it: every record from
// offset 0, read_uncommitted with the transactions' control records, so
// that it sees which offsets it has (a record the log cleaner removed
// before it was read leaves a gap) and when each transaction committed (the
// timestamp of its COMMIT marker: no instance reads a record with
// read_committed before that). It resolves the transactions itself: the
// data records of an aborted one count for nothing; those of one whose
// marker it has not read may have committed, so they may end an item but
// never open one.
//
// From the offsets it takes, per template, the holds of its items: an item
// record at offset o holds the template on every instance from its commit
// (plus latchReach, the time every instance takes to read it) until the
// first later record that ends it, its tombstone or a RESET of its
// template, was written (that record's timestamp: the writer's batch, which
// may already act on it). A hold with a gap of unread offsets between its
// item and its end is not checked: the gap may hide what ended it.

// logRec is one data record of the breakers topic: its transaction's
// commit time (zero: its marker was not read, it may or may not have
// committed), and its place in the topic's order (order: its offset).
type logRec struct {
	rec       *kgo.Record
	committed time.Time
	// readable is when a read_committed reader could first read it: its
	// commit, and the end of every transaction that began before it on its
	// partition (the last stable offset stays below an open transaction's
	// first record: a paused instance's open transaction holds back every
	// record after it); zero while one of those never ended
	readable time.Time
	order    int64
}

// legacyOrder moves the records of partitions other than 0, of a breakers
// topic an earlier release created with several, before every record of
// partition 0, the only one written now: the routers read them so.
const legacyOrder = int64(1) << 62

// orderOf is the place of offset of partition p in the topic's order.
func orderOf(p int32, offset int64) int64 {
	if p != 0 {
		return offset - legacyOrder
	}
	return offset
}

// breakerLog is the breakers topic as read: its data records in the
// topic's order (those of aborted transactions left out), and the offsets
// the capture never read, as [from, to) of the order.
type breakerLog struct {
	recs []logRec
	gaps [][2]int64
	read int // records read, control records included
}

// readBreakerLog resolves the transactions of recs (any order, duplicates
// allowed), partition by partition, and finds the offsets missing from
// them.
func readBreakerLog(recs []*kgo.Record) breakerLog {
	sorted := slices.Clone(recs)
	slices.SortStableFunc(sorted, func(a, b *kgo.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	sorted = slices.CompactFunc(sorted, func(a, b *kgo.Record) bool { return a.Partition == b.Partition && a.Offset == b.Offset })
	var l breakerLog
	l.read = len(sorted)
	var all []logRec
	aborted := map[int]bool{}
	type txn struct {
		p   int32
		pid int64
	}
	open := map[txn][]int{} // the indexes in all of each open transaction's records
	next := map[int32]int64{}
	for _, r := range sorted {
		if n := next[r.Partition]; r.Offset > n {
			l.gaps = append(l.gaps, [2]int64{orderOf(r.Partition, n), orderOf(r.Partition, r.Offset)})
		}
		next[r.Partition] = r.Offset + 1
		x := txn{r.Partition, r.ProducerID}
		switch {
		case r.Attrs.IsControl():
			commit := controlCommits(r)
			for _, i := range open[x] {
				if commit {
					all[i].committed = r.Timestamp
				} else {
					aborted[i] = true // never happened
				}
			}
			delete(open, x)
		case r.Attrs.IsTransactional():
			open[x] = append(open[x], len(all))
			all = append(all, logRec{rec: r, order: orderOf(r.Partition, r.Offset)})
		default:
			all = append(all, logRec{rec: r, committed: r.Timestamp, order: orderOf(r.Partition, r.Offset)})
		}
	}
	// the transactions' spans: first record, marker and its time
	type span struct {
		p           int32
		first, last int64
		end         time.Time
	}
	var spans []span
	firsts := map[txn]int64{}
	for _, r := range sorted {
		x := txn{r.Partition, r.ProducerID}
		switch {
		case r.Attrs.IsControl():
			if f, ok := firsts[x]; ok {
				spans = append(spans, span{r.Partition, f, r.Offset, r.Timestamp})
				delete(firsts, x)
			}
		case r.Attrs.IsTransactional():
			if _, ok := firsts[x]; !ok {
				firsts[x] = r.Offset
			}
		}
	}
	for x, f := range firsts { // never ended while read
		spans = append(spans, span{x.p, f, math.MaxInt64, time.Time{}})
	}
	for i := range all {
		r := &all[i]
		r.readable = r.committed
		for _, sp := range spans {
			if sp.p != r.rec.Partition || sp.first >= r.rec.Offset || sp.last <= r.rec.Offset {
				continue
			}
			if sp.end.IsZero() {
				r.readable = time.Time{}
				break
			}
			if !r.readable.IsZero() && sp.end.After(r.readable) {
				r.readable = sp.end
			}
		}
	}
	for i, r := range all {
		if !aborted[i] {
			l.recs = append(l.recs, r)
		}
	}
	slices.SortStableFunc(l.recs, func(a, b logRec) int {
		return cmp.Or(cmp.Compare(a.order, b.order), cmp.Compare(a.rec.Partition, b.rec.Partition))
	})
	return l
}

// controlCommits reports whether a control record is a COMMIT marker (its
// key: a version and a type, 1 for COMMIT, 0 for ABORT).
func controlCommits(r *kgo.Record) bool {
	return len(r.Key) >= 4 && binary.BigEndian.Uint16(r.Key[2:4]) == 1
}

// gapIn reports whether an offset between the places from and to in the
// topic's order (both excluded) was never read.
func (l *breakerLog) gapIn(from, to int64) bool {
	return slices.ContainsFunc(l.gaps, func(g [2]int64) bool { return g[0] < to && g[1] > from+1 })
}

// unread counts the offsets never read.
func (l *breakerLog) unread() int64 {
	var n int64
	for _, g := range l.gaps {
		n += g[1] - g[0]
	}
	return n
}

// writer is the instance (or person) that wrote a record of the breakers
// topic: its faultrouter.breaker.instance header, else the instance in its
// value.
func writer(r *kgo.Record, valueInstance string) string {
	if w := codec.ParseBreakerHeaders(r.Headers).Instance; w != "" {
		return w
	}
	return valueInstance
}

// hold is one latch item's hold on its prompt template, from the breakers
// topic: the item record at offset (its key, its task, written by by at
// from, readable with read_committed from committed: logRec.readable),
// held on every instance latchReach after that until to (the timestamp of the record that ended it, its
// tombstone or a RESET of the template; zero while it lasts). aboveReset is
// the offset of the template's RESET it was written after (-1: none);
// endedBy what ended it; checked false when unread offsets lie between the
// item and its end.
type hold struct {
	key, task, by string
	offset        int64
	from          time.Time
	committed, to time.Time
	aboveReset    int64
	endedBy       string
	checked       bool
}

// holding reports whether h held its template on every instance at t.
func (h hold) holding(t time.Time) bool {
	return h.checked && !h.committed.IsZero() && t.After(h.committed.Add(latchReach)) && (h.to.IsZero() || t.Before(h.to))
}

// resetRec is a RESET record of a breaker: its offset, when it was written
// and by whom, and whether its transaction is known to have committed.
type resetRec struct {
	offset    int64
	order     int64 // its place in the topic's order
	at        time.Time
	by        string
	committed bool
}

// breakerTopic reads Logs.Breakers once: the holds of every prompt
// template's items (latchHolds) and the RESET records of every breaker.
func (c *checker) breakerTopic() {
	if c.holds != nil {
		return
	}
	c.holds, c.resets, c.itemSeen = map[string][]hold{}, map[breaker.Ref][]resetRec{}, map[itemSeen]bool{}
	if c.logs.Breakers == nil {
		return
	}
	l := readBreakerLog(c.logs.Breakers)
	c.rep.Latch.Records, c.rep.Latch.Unread = l.read, l.unread()
	for _, r := range l.recs {
		key := string(r.rec.Key)
		if strings.HasPrefix(key, event.BreakerItemPrefix) {
			if r.rec.Value == nil {
				c.itemSeen[itemSeen{key, r.rec.Timestamp.UnixMilli(), false}] = true
			} else if it, err := event.DecodeBreakerItem(r.rec.Value); err == nil {
				c.itemSeen[itemSeen{key, it.OpenedAt.UnixMilli(), true}] = true
			}
		}
		if !strings.HasPrefix(key, event.BreakerResetPrefix) || r.rec.Value == nil {
			continue
		}
		sc, k, ok := event.ParseBreakerKey(strings.TrimPrefix(key, event.BreakerResetPrefix))
		scope, err := breaker.ParseScope(sc)
		s, derr := event.DecodeBreakerState(r.rec.Value)
		if !ok || err != nil || derr != nil || !s.Reset {
			continue
		}
		ref := breaker.Ref{Scope: scope, Key: k}
		c.resets[ref] = append(c.resets[ref], resetRec{offset: r.rec.Offset, order: r.order, at: r.rec.Timestamp, by: writer(r.rec, s.Instance), committed: !r.committed.IsZero()})
		if !r.committed.IsZero() {
			c.rep.Latch.Resets++
		}
	}
	for i, r := range l.recs {
		key := string(r.rec.Key)
		if !strings.HasPrefix(key, event.BreakerItemPrefix) || r.rec.Value == nil || r.committed.IsZero() {
			continue
		}
		it, err := event.DecodeBreakerItem(r.rec.Value)
		if err != nil || it.Scope != breaker.PromptTemplate.Name() {
			continue
		}
		ref := breaker.Ref{Scope: breaker.PromptTemplate, Key: it.Key}
		resetKey := event.BreakerResetKey(it.Scope, it.Key)
		// held everywhere once every instance could read it
		h := hold{key: key, task: it.TaskID, by: writer(r.rec, it.Instance), offset: r.rec.Offset, from: it.OpenedAt.Time,
			committed: r.readable, aboveReset: -1}
		if !c.sharesLatches(h.by, h.from) {
			continue // a release that keeps its latches in its own memory
		}
		c.rep.Latch.Items++
		for _, rs := range c.resets[ref] {
			if rs.committed && rs.order < r.order {
				h.aboveReset = rs.offset
			}
		}
		end := int64(1<<63 - 1)
		for _, n := range l.recs[i+1:] {
			nk := string(n.rec.Key)
			switch {
			case nk == key && n.rec.Value == nil:
				h.endedBy = "its tombstone"
			case nk == resetKey && n.rec.Value != nil:
				h.endedBy = "a RESET"
			default:
				continue
			}
			h.to, end = n.rec.Timestamp, n.order
			h.endedBy += " at offset " + strconv.FormatInt(n.rec.Offset, 10) + " by " + writer(n.rec, "")
			break
		}
		if r.rec.Partition == 0 {
			// an earlier release's decision of the item, written by key to
			// another partition: the routers take it as after the item
			for _, n := range l.recs[:i] {
				if string(n.rec.Key) == key && n.rec.Value == nil && n.rec.Partition != 0 && !n.committed.IsZero() &&
					n.rec.Timestamp.After(r.committed) && (h.to.IsZero() || n.rec.Timestamp.Before(h.to)) {
					h.to = n.rec.Timestamp
					h.endedBy = "its tombstone on partition " + strconv.Itoa(int(n.rec.Partition)) + " by " + writer(n.rec, "")
				}
			}
		}
		h.checked = !l.gapIn(r.order, end)
		switch {
		case !h.checked:
			c.rep.Latch.Unchecked++
		case strings.HasPrefix(h.endedBy, "a RESET"):
			c.rep.Latch.EndedByReset++
		}
		if h.aboveReset >= 0 {
			c.rep.Latch.AboveReset++
		}
		c.holds[it.Key] = append(c.holds[it.Key], h)
	}
	for _, hs := range c.holds {
		slices.SortFunc(hs, func(a, b hold) int { return cmp.Or(a.from.Compare(b.from), cmp.Compare(a.offset, b.offset)) })
	}
}
