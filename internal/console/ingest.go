package console

// ingest.go keeps the view up to date: one client reads every partition of
// the review, decisions, audit, retry, alerts, dead-letter and console topics
// (read_committed) from the offsets stored in the view, applies each poll to
// the view in one Pebble batch together with the new offsets, and tells the
// open pages what changed. An empty view starts at the beginning of each
// topic: that is the rebuild, and its progress shows on every page.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// viewTopics are the short names of the topics the view is built from.
var viewTopics = []topicspec.Short{topicspec.Review, topicspec.Decisions, topicspec.Audit, topicspec.Retry, topicspec.Alerts, topicspec.DeadLetter}

// progress is how far the view is behind the topics' ends at start-up.
type progress struct {
	mu       sync.Mutex
	total    int64 // records between the stored offsets and the ends at start
	read     int64
	caughtUp bool
	err      string
}

func (p *progress) snapshot() (read, total int64, caughtUp bool, err string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.read, p.total, p.caughtUp, p.err
}

// ingest reads the topics into the view until ctx ends.
func (s *Server) ingest(ctx context.Context) error {
	names := map[string]topicspec.Short{} // full name -> short
	var topics []string
	for _, short := range viewTopics {
		n := s.topic(short)
		names[n] = short
		topics = append(topics, n)
	}
	names[s.consoleTopic()] = consoleShort
	topics = append(topics, s.consoleTopic())
	stored, err := s.view.offsets()
	if err != nil {
		return fmt.Errorf("console: reading the view's offsets: %w", err)
	}
	adm, err := kgo.NewClient(s.cfg.Kafka...)
	if err != nil {
		return err
	}
	var (
		starts, ends kadm.ListedOffsets
		lerr         error
	)
	for {
		starts, lerr = kadm.NewClient(adm).ListStartOffsets(ctx, topics...)
		if lerr == nil {
			ends, lerr = kadm.NewClient(adm).ListCommittedOffsets(ctx, topics...)
		}
		if lerr == nil {
			lerr = errors.Join(starts.Error(), ends.Error())
		}
		if lerr == nil || ctx.Err() != nil {
			break
		}
		s.setErr(fmt.Sprintf("listing the topics: %v (retrying)", lerr))
		s.log.Warn("console: listing topics", "err", lerr)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	adm.Close()
	if ctx.Err() != nil {
		return nil
	}
	s.setErr("")
	consume := map[string]map[int32]kgo.Offset{}
	var behind int64
	ends.Each(func(e kadm.ListedOffset) {
		from := int64(0)
		if st, ok := starts.Lookup(e.Topic, e.Partition); ok {
			from = st.Offset
		}
		if o, ok := stored[e.Topic][e.Partition]; ok && o > from {
			from = o
		}
		if consume[e.Topic] == nil {
			consume[e.Topic] = map[int32]kgo.Offset{}
		}
		consume[e.Topic][e.Partition] = kgo.NewOffset().At(from)
		if e.Offset > from {
			behind += e.Offset - from
		}
	})
	s.prog.mu.Lock()
	s.prog.total = behind
	s.prog.caughtUp = behind == 0
	s.prog.mu.Unlock()
	s.log.Info("console: reading the topics into the view", "records_behind", behind)

	cl, err := kgo.NewClient(append(s.cfg.Kafka, kgo.ConsumePartitions(consume), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// the commit markers count towards the end offsets of the progress
		kgo.KeepControlRecords())...)
	if err != nil {
		return err
	}
	defer cl.Close()
	lastNote, lastPrune := time.Time{}, time.Time{}
	for {
		// a quiet cluster still gets its view pruned: the poll ends at
		// the next prune
		pctx, pcancel := context.WithTimeout(ctx, pruneEvery(s.cfg.ViewRetention))
		fetches := cl.PollFetches(pctx)
		pcancel()
		if ctx.Err() != nil {
			return nil
		}
		fetches.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				s.log.Warn("console: fetch", "topic", t, "partition", p, "err", err)
			}
		})
		if now := time.Now(); now.Sub(lastPrune) >= pruneEvery(s.cfg.ViewRetention) { // retention.go
			n, err := s.prune(now)
			if err != nil {
				return fmt.Errorf("console: pruning the view: %w", err)
			}
			if n > 0 {
				s.log.Info("console: view entries past their retention deleted", "entries", n, "retention", s.cfg.ViewRetention)
			}
			lastPrune = now
		}
		if fetches.NumRecords() == 0 {
			continue
		}
		b := s.view.batch()
		var notes []note
		fetches.EachRecord(func(rec *kgo.Record) {
			if rec.Attrs.IsControl() {
				return
			}
			n, err := s.apply(b, rec, names[rec.Topic])
			if err != nil {
				s.log.Warn("console: record not applied", "task_id", string(rec.Key), "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "err", err)
			}
			if n != nil {
				notes = append(notes, *n)
			}
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				last := p.Records[len(p.Records)-1]
				b.offset(p.Topic, p.Partition, last.Offset+1)
			}
		})
		if err := b.commit(); err != nil {
			return fmt.Errorf("console: writing the view: %w", err)
		}
		s.prog.mu.Lock()
		s.prog.read += int64(fetches.NumRecords())
		wasCaughtUp := s.prog.caughtUp
		if s.prog.read >= s.prog.total {
			s.prog.caughtUp = true
		}
		caughtUp := s.prog.caughtUp
		s.prog.mu.Unlock()
		if !caughtUp {
			if time.Since(lastNote) > time.Second {
				s.hub.publish(note{Kind: "progress"})
				lastNote = time.Now()
			}
			continue
		}
		if !wasCaughtUp {
			s.hub.publish(note{Kind: "progress"})
		}
		for _, n := range notes {
			s.hub.publish(n)
		}
	}
}

func (s *Server) setErr(msg string) {
	s.prog.mu.Lock()
	s.prog.err = msg
	s.prog.mu.Unlock()
}

// apply changes the view for one record and returns what to tell the pages.
func (s *Server) apply(b *batch, rec *kgo.Record, short topicspec.Short) (*note, error) {
	switch short {
	case topicspec.DeadLetter:
		return s.applyDeadLetter(b, rec)
	case consoleShort:
		return s.applyAction(b, rec)
	}
	st := replay.Decode(s.codec, rec, short)
	ts := rec.Timestamp
	switch v := st.Value.(type) {
	case *event.Routed:
		task := st.TaskID
		switch short {
		case topicspec.Review:
			if s.cfg.Webhooks != nil && v.Decision.Review != nil && v.Decision.Review.Priority == policy.PriorityHigh {
				if err := b.b.Set([]byte("nq/"+task), nil, nil); err != nil { // notify.go
					return nil, err
				}
			}
			return s.updateItem(b, task, func(it *reviewItem) { applyReview(it, v, ts) })
		case topicspec.Audit:
			if err := s.trackRetry(b, task, v, ts); err != nil {
				return nil, err
			}
			if err := s.accountCost(b, v, rec.Headers, ts); err != nil { // cost.go
				return nil, err
			}
			if !closes(&v.Decision) {
				return nil, nil
			}
			// a reviewer's decision may be read before its item (a
			// rebuild); any other closing event matters only to an item
			if !manual(&v.Decision) {
				var it reviewItem
				if ok, err := b.get("rev/"+task, &it); err != nil || !ok {
					return nil, err
				}
			}
			return s.updateItem(b, task, func(it *reviewItem) { applyAudit(it, &v.Decision, ts) })
		case topicspec.Retry:
			var p pendingRetry
			if ok, err := b.get("due/"+task, &p); err != nil || !ok {
				return nil, err
			}
			if !ts.Before(p.At) {
				return nil, delDue(b, &p)
			}
		}
	case *event.ReviewDecision:
		return s.updateItem(b, v.TaskID, func(it *reviewItem) { applyDecision(it, v, ts) })
	case *event.BreakerEvent:
		if short != topicspec.Alerts {
			return nil, nil // a breaker reset command: its transition comes on alerts
		}
		a := alert{BreakerEvent: *v, Time: ts, Partition: rec.Partition, Offset: rec.Offset}
		if err := b.put(fmt.Sprintf("alr/%s/%08x/%016x", timeKey(ts.UnixMilli()), rec.Partition, rec.Offset), a); err != nil {
			return nil, err
		}
		if v.Kind == "TRANSITION" {
			key := "brk/" + string(v.Scope) + "/" + v.Key
			var bv breakerView
			if _, err := b.get(key, &bv); err != nil {
				return nil, err
			}
			was := bv.State
			applyTransition(&bv, v, codec.ParseBreakerHeaders(rec.Headers).Latched, ts)
			if err := b.put(key, bv); err != nil {
				return nil, err
			}
			if was != "" && was != bv.State {
				if err := b.del(breakerOrderKey(was, v.Scope, v.Key)); err != nil {
					return nil, err
				}
			}
			if err := b.b.Set([]byte(breakerOrderKey(bv.State, v.Scope, v.Key)), nil, nil); err != nil {
				return nil, err
			}
		}
		return &note{Kind: "alert", Alert: &a}, nil
	}
	return nil, nil
}

// queueEntry is an open item in the queue index: what the queue filters
// and counts by, without decoding the item. Stored as owner NUL class.
type queueEntry struct {
	Owner, Class string
	// Template is a hallucination item's prompt template, Decided whether
	// someone decided the item (the router has not audited it yet): the
	// queue counts the items that keep each latched template offline from
	// the index alone
	Template string
	Decided  bool
}

func (e queueEntry) bytes() []byte {
	d := "0"
	if e.Decided {
		d = "1"
	}
	return []byte(e.Owner + "\x00" + e.Class + "\x00" + e.Template + "\x00" + d)
}

func parseQueueEntry(b []byte) queueEntry {
	f := strings.SplitN(string(b), "\x00", 4)
	for len(f) < 4 {
		f = append(f, "")
	}
	return queueEntry{Owner: f[0], Class: f[1], Template: f[2], Decided: f[3] == "1"}
}

// The queue's counts, kept as items open and close, so that a page of the
// queue reads no more than its page, whatever the queue holds: open items
// by owner (qc/o/<owner>), by class (qc/c/<class>), and the hallucination
// items no one decided yet by template (qc/t/<template>).
const (
	countOwner    = "qc/o/"
	countClass    = "qc/c/"
	countTemplate = "qc/t/"
)

// countEntry adds d to the counts of an open item's entry.
func countEntry(b *batch, e queueEntry, d int) error {
	keys := []string{countOwner + e.Owner, countClass + e.Class}
	if e.Template != "" && !e.Decided {
		keys = append(keys, countTemplate+e.Template)
	}
	for _, k := range keys {
		var n int
		if _, err := b.get(k, &n); err != nil {
			return err
		}
		var err error
		if n += d; n > 0 {
			err = b.put(k, n)
		} else {
			err = b.del(k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// entryOf is the queue index entry of an open item.
func entryOf(it *reviewItem) queueEntry {
	e := queueEntry{Owner: it.Owner, Class: it.Class, Decided: it.decided() != nil}
	if it.Class == string(event.ClassHallucination) {
		e.Template = it.Template
	}
	return e
}

func queueKey(it *reviewItem) string {
	return "q/" + timeKey(it.dueAt().UnixMilli()) + "/" + it.TaskID
}

func closedKey(it *reviewItem) string {
	return "cls/" + timeKey(it.ClosedAt.UnixMilli()) + "/" + it.TaskID
}

// updateItem applies fn to the task's review item and keeps the open
// marker and the queue and closed indexes.
func (s *Server) updateItem(b *batch, task string, fn func(*reviewItem)) (*note, error) {
	var it reviewItem
	if _, err := b.get("rev/"+task, &it); err != nil {
		return nil, err
	}
	it.TaskID = task
	was := it
	fn(&it)
	if err := b.put("rev/"+task, it); err != nil {
		return nil, err
	}
	if was.open() {
		if err := b.del(queueKey(&was)); err != nil {
			return nil, err
		}
		if err := countEntry(b, entryOf(&was), -1); err != nil {
			return nil, err
		}
	} else if was.Closed != nil && !was.OpenedAt.IsZero() {
		if err := b.del(closedKey(&was)); err != nil {
			return nil, err
		}
	}
	if was.orphan() { // retention.go
		if err := b.del(orphanKey(&was)); err != nil {
			return nil, err
		}
	}
	if it.orphan() {
		if err := b.b.Set([]byte(orphanKey(&it)), nil, nil); err != nil {
			return nil, err
		}
	}
	var err error
	switch {
	case it.open():
		if err = b.b.Set([]byte("open/"+task), nil, nil); err == nil {
			err = b.b.Set([]byte(queueKey(&it)), entryOf(&it).bytes(), nil)
		}
		if err == nil {
			err = countEntry(b, entryOf(&it), 1)
		}
	default:
		if err = b.del("open/" + task); err == nil && it.Closed != nil && !it.OpenedAt.IsZero() {
			err = b.b.Set([]byte(closedKey(&it)), nil, nil)
		}
	}
	return &note{Kind: "review", Item: &it}, err
}

// trackRetry keeps the audited retries not yet published (due/<task>): a
// RETRY decision adds one, any later decision of the task removes it.
func (s *Server) trackRetry(b *batch, task string, r *event.Routed, ts time.Time) error {
	d := &r.Decision
	if d.Route == event.RouteDrop {
		return nil
	}
	var p pendingRetry
	ok, err := b.get("due/"+task, &p)
	if err != nil {
		return err
	}
	if ok && ts.Before(p.At) {
		return nil
	}
	if ok {
		if err := delDue(b, &p); err != nil {
			return err
		}
	}
	if d.Route == event.RouteRetry && d.Retry != nil {
		p = pendingRetry{TaskID: task, NotBefore: d.Retry.NotBefore.Time, Refs: retryRefs(r.Event), At: ts}
		if err := b.put("due/"+task, p); err != nil {
			return err
		}
		var nb [8]byte
		binary.BigEndian.PutUint64(nb[:], uint64(p.NotBefore.UnixMilli()))
		for _, ref := range p.Refs {
			if err := b.b.Set([]byte(dueRefKey(ref, task)), nb[:], nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// delDue forgets a retry not yet published, with its entries under its
// breakers.
func delDue(b *batch, p *pendingRetry) error {
	for _, ref := range p.Refs {
		if err := b.del(dueRefKey(ref, p.TaskID)); err != nil {
			return err
		}
	}
	return b.del("due/" + p.TaskID)
}

// dueRefKey is the entry of a retry not yet published under a breaker it
// goes into (ref: SCOPE/key).
func dueRefKey(ref, task string) string { return "dueref/" + ref + "/\x00" + task }

// breakerOrderKey is a breaker's place on the Breakers page: open ones
// first, then half-open, then closed, each by scope and key.
func breakerOrderKey(state event.BreakerStateName, scope event.BreakerScope, key string) string {
	rank := "2"
	switch state {
	case breaker.Open.Name():
		rank = "0"
	case breaker.HalfOpen.Name():
		rank = "1"
	}
	return "brks/" + rank + "/" + string(scope) + "/" + key
}

// applyDeadLetter stores a dead-letter record with its original bytes.
func (s *Server) applyDeadLetter(b *batch, rec *kgo.Record) (*note, error) {
	st := replay.Decode(s.codec, rec, topicspec.DeadLetter)
	d := deadLetter{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Time: rec.Timestamp,
		Key: rec.Key, Value: rec.Value, Headers: rec.Headers, TaskID: st.TaskID,
		Redrives: replay.RedriveCount(rec.Headers)}
	if e := codec.ParseHeaders(rec.Headers).Error; e != nil {
		d.ErrorKind, d.Message, d.Class = e.Kind, e.Message, e.Class
	}
	if st.Kind == replay.KindPoison {
		d.Class = string(event.ClassInvalidInput)
	}
	if st.Decision != nil {
		d.Class = string(st.Decision.Class)
		if d.Message == "" {
			d.Message = st.Decision.Reason
		}
	}
	if e := st.Event; e != nil {
		d.Provider, d.Model, d.Template = e.Provider, e.Model, e.PromptTemplate
	}
	if err := b.put(d.key(), d); err != nil {
		return nil, err
	}
	return &note{Kind: "deadletter"}, b.b.Set([]byte("dli/"+d.id()), []byte(d.key()), nil)
}
