package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
)

// breakerRec appends a record of the breakers topic written at at by
// instance by (producer ID producer) in a transaction of its own, and its
// COMMIT marker written at commit (zero: no marker, the transaction is
// still open). It returns the record's offset.
func (b *logBuilder) breakerRec(key string, value []byte, by string, producer int64, at, commit time.Time) int64 {
	off := b.breakerNext
	b.breakerNext++
	b.logs.Breakers = append(b.logs.Breakers, &kgo.Record{Topic: "breakers", Offset: off, Key: []byte(key), Value: value, Timestamp: at,
		ProducerID: producer, Attrs: kgo.NewRecordAttrs(kgo.RecordAttrsOpts{Transactional: true}),
		Headers: []kgo.RecordHeader{{Key: codec.HeaderBreakerInstance, Value: []byte(by)}}})
	if !commit.IsZero() {
		b.marker(producer, commit, true)
	}
	return off
}

// marker appends the control record that ends producer's transaction.
func (b *logBuilder) marker(producer int64, at time.Time, commit bool) {
	key := []byte{0, 0, 0, 0}
	if commit {
		key[3] = 1
	}
	b.logs.Breakers = append(b.logs.Breakers, &kgo.Record{Topic: "breakers", Offset: b.breakerNext, Key: key, Timestamp: at,
		ProducerID: producer, Attrs: kgo.NewRecordAttrs(kgo.RecordAttrsOpts{Transactional: true, Control: true})})
	b.breakerNext++
}

// item appends the latch item record of task on template tpl that
// instance by wrote at at (open), or its tombstone, committed 50 ms later.
func (b *logBuilder) item(tpl, task, by string, producer int64, at time.Time, open bool) int64 {
	return b.itemCommitted(tpl, task, by, producer, at, at.Add(50*time.Millisecond), open)
}

func (b *logBuilder) itemCommitted(tpl, task, by string, producer int64, at, commit time.Time, open bool) int64 {
	var v []byte
	if open {
		var err error
		if v, err = event.EncodeBreakerItem(&event.BreakerItem{Scope: "PROMPT_TEMPLATE", Key: tpl, TaskID: task, OpenedAt: event.At(at), Instance: by}); err != nil {
			b.t.Fatal(err)
		}
	}
	return b.breakerRec(event.BreakerItemKey("PROMPT_TEMPLATE", tpl, task), v, by, producer, at, commit)
}

// reset appends a person's RESET record of template tpl written at at,
// committed 50 ms later.
func (b *logBuilder) reset(tpl string, at time.Time) int64 {
	v, err := event.EncodeBreakerState(&event.BreakerState{Scope: "PROMPT_TEMPLATE", Key: tpl, State: "CLOSED", Reset: true,
		Reason: "checked", UpdatedAt: event.At(at), Instance: "ops"})
	if err != nil {
		b.t.Fatal(err)
	}
	return b.breakerRec(event.BreakerResetKey("PROMPT_TEMPLATE", tpl), v, "ops", 99, at, at.Add(50*time.Millisecond))
}

// hallucinated writes instance a's (producer 7) correct outputs for a
// hallucination of template tpl by task id at input offset off, its item
// left to the caller; it returns its decision and the task's state.
func (b *logBuilder) hallucinated(off int64, id string) (event.Decision, event.TaskEvent, *task.State) {
	h := event.TaskEvent{EventID: "e-" + id, TaskID: id, Attempt: 1, OccurredAt: event.At(b.t0), Source: "w", Action: "refund",
		Provider: "openai", Model: "gpt-4o", PromptTemplate: "tpl", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "Refund per policy 99.", SchemaValid: ptrTo(true), Confidence: ptrTo(0.95), Flags: []string{"fabricated_data"}},
		Usage:  event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 100}}
	st := &task.State{}
	in := b.input(off, h)
	d := policy.Default().Decide(&h, st, in.Timestamp.Add(100*time.Millisecond))
	b.routed("audit", in, &h, audited(d))
	b.routed("review", in, &h, d)
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "ALERT", Reason: "output quarantined: " + d.Reason,
		Class: d.Class, TaskID: id, Instance: "a", At: d.DecidedAt},
		kgo.RecordHeader{Key: codec.HeaderAlert, Value: []byte(codec.AlertQuarantined)})
	return d, h, st
}

// rejected writes a reviewer's rejection of task id's item at at (decisions
// offset off), audited by a, and its tombstone; it returns the decision.
func (b *logBuilder) rejected(off int64, id string, h *event.TaskEvent, st *task.State, at time.Time) event.Decision {
	rd := event.ReviewDecision{TaskID: id, Reason: "fabricated", Reviewer: "ana", At: event.At(at)}
	v, err := b.c.EncodeReviewDecision(nil, &rd)
	if err != nil {
		b.t.Fatal(err)
	}
	rin := &kgo.Record{Topic: "decisions", Offset: off, Key: []byte(id), Value: v, Timestamp: at}
	b.logs.Decisions = append(b.logs.Decisions, rin)
	d := policy.Default().DecideReview(&rd, st, at.Add(100*time.Millisecond))
	b.routed("audit", rin, h, audited(d))
	b.item("tpl", id, "a", 7, d.DecidedAt.Time, false)
	return d
}

// retryOnB writes instance b's (producer 8) timeout of task t-1 of template
// tpl at input offset off, and its retry published at publish(its due
// time); it returns the decision.
func (b *logBuilder) retryOnB(t *testing.T, off int64, publish func(due time.Time) time.Time) event.Decision {
	tmo := timeout("t-1", "e-1", 1, b.t0.Add(time.Duration(off)*5*time.Second))
	tmo.PromptTemplate = "tpl"
	var st task.State
	tin := b.input(off, tmo)
	td := policy.Default().Decide(&tmo, &st, tin.Timestamp.Add(100*time.Millisecond))
	if td.Route != event.RouteRetry {
		t.Fatalf("the timeout was decided %s (%s), want a retry", td.Route, td.Reason)
	}
	b.routed("audit", tin, &tmo, audited(td))
	b.logs.Audit[len(b.logs.Audit)-1].ProducerID = 8
	due := td
	due.DecidedAt = event.At(publish(td.Retry.NotBefore.Time))
	b.routed("retry", nil, &tmo, due)
	b.logs.Retry[len(b.logs.Retry)-1].ProducerID = 8
	return td
}

// latched writes a's TRANSITION that latched tpl at at (by task id).
func (b *logBuilder) latched(id string, at event.Timestamp) {
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "CLOSED", To: "OPEN",
		Reason: "MODEL_HALLUCINATION: open until a person resets it", Class: event.ClassHallucination, TaskID: id,
		Instance: "a", At: at}, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("true")})
}

// latchElsewhereRun writes the logs of two router instances: a (producer 7)
// routes a hallucination of template tpl (task h-1), which latches it and
// writes its item, and a reviewer rejects h-1's item a minute later, which
// writes its tombstone and reopens the template; b (producer 8) routes a
// timeout of task t-1 of the same template 10 s after the latch and
// publishes its retry at publish after its due time (zero: at its due
// time). b's transitions say nothing of the latch: only the breakers topic
// does.
func latchElsewhereRun(t *testing.T, publish time.Duration) *Report {
	b := newLog(t)
	hd, h, hst := b.hallucinated(0, "h-1")
	b.latched("h-1", hd.DecidedAt)
	b.item("tpl", "h-1", "a", 7, hd.DecidedAt.Time, true)
	td := b.retryOnB(t, 2, func(due time.Time) time.Time { return due.Add(publish) })
	at := b.t0.Add(time.Minute)
	rdd := b.rejected(0, "h-1", &h, hst, at)
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "OPEN", To: "CLOSED",
		Reason: "ana decided the MODEL_HALLUCINATION item of task h-1: fabricated", Class: event.ClassHallucination,
		TaskID: "h-1", Instance: "a", At: rdd.DecidedAt}, kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("false")})
	if !td.Retry.NotBefore.Before(at) {
		t.Fatalf("the retry is due at %s, not inside the latch (until %s)", stamp(td.Retry.NotBefore.Time), stamp(at))
	}
	return b.check()
}

// Guards breaker.latch_everywhere: a template latched by a hallucination on
// instance a holds the retries of instance b too, from latchReach after the
// commit of its item on the breakers topic until the item's tombstone. b
// publishing a retry of that template while the item is open is reported,
// though b's own transitions never show the latch; b holding it until the
// reviewer's decision passes, and counts as a retry the shared latch held.
func TestLatchHoldsEverywhere(t *testing.T) {
	rep := latchElsewhereRun(t, 0)
	if rep.ViolationsByCheck["breaker.latch_everywhere"] != 1 {
		t.Fatalf("a retry published on b into a template latched on a: %d breaker.latch_everywhere violations, want 1: %v",
			rep.ViolationsByCheck["breaker.latch_everywhere"], rep.Violations)
	}
	if v := rep.Violations[0]; v.Task != "t-1" || !strings.Contains(v.Detail, "task h-1's item") || !strings.Contains(v.Detail, "offset 0") {
		t.Errorf("the violation does not name the retry's task and the item that latched: %+v", v)
	}

	rep = latchElsewhereRun(t, time.Minute)
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("b held the retry until the template reopened, yet: %s", s.String())
	}
	if rep.Latch.Stretches != 1 || rep.Latch.HeldElsewhere != 1 || rep.Latch.Items != 1 {
		t.Fatalf("latch report %+v, want 1 item, 1 stretch and 1 retry held elsewhere", rep.Latch)
	}
}

// lateResetRun writes the logs of a RESET of template tpl and of two
// hallucination items of it, both decided on instance a before the RESET
// was written: h-1's committed before it, h-2's (a batch that was slow to
// commit) before it when itemFirst, else after it, so that h-2's item has
// the higher offset. b publishes a retry of tpl 14 s after the RESET,
// while h-2's item is open (its reviewer decides a minute after); a
// releases the template on the RESET 6 s after it.
func lateResetRun(t *testing.T, itemFirst bool) *Report {
	b := newLog(t)
	d1, h1, st1 := b.hallucinated(0, "h-1") // decided at t0+0.1s
	b.latched("h-1", d1.DecidedAt)
	b.item("tpl", "h-1", "a", 7, d1.DecidedAt.Time, true)
	d2, h2, st2 := b.hallucinated(1, "h-2") // decided at t0+5.1s
	resetAt := b.t0.Add(6 * time.Second)
	if itemFirst {
		b.item("tpl", "h-2", "a", 7, d2.DecidedAt.Time, true)
		b.reset("tpl", resetAt)
	} else {
		b.reset("tpl", resetAt)
		b.itemCommitted("tpl", "h-2", "a", 7, d2.DecidedAt.Time, resetAt.Add(time.Second), true)
	}
	b.alert(event.BreakerEvent{Scope: "PROMPT_TEMPLATE", Key: "tpl", Kind: "TRANSITION", From: "OPEN", To: "CLOSED",
		Reason: "ops reset the breaker: checked", Instance: "a", At: event.At(resetAt.Add(6 * time.Second))},
		kgo.RecordHeader{Key: codec.HeaderBreakerLatched, Value: []byte("false")}, adoptedFrom("ops"))
	pub := resetAt.Add(14 * time.Second)
	td := b.retryOnB(t, 2, func(time.Time) time.Time { return pub }) // decided at t0+10.1s
	if td.Retry.NotBefore.After(pub) {
		t.Fatalf("the retry is due at %s, after it is published (%s)", stamp(td.Retry.NotBefore.Time), stamp(pub))
	}
	b.rejected(0, "h-1", &h1, st1, b.t0.Add(time.Minute))
	b.rejected(1, "h-2", &h2, st2, b.t0.Add(time.Minute))
	return b.check()
}

// Guards the order of latches and resets: the breakers topic's offsets, not
// the writers' clocks. A RESET ends the items written before it and none
// written after it, even one whose hallucination was decided before the
// RESET was written (its batch committed after): a retry published while
// such an item is open is a breach (breaker.latch_everywhere), and so is an
// instance releasing the template on the RESET then (breaker.latch_items).
// With the same times and the item written before the RESET, the RESET
// ends it, and the same retry and release are right.
func TestLatchOrderedByOffsetsNotClocks(t *testing.T) {
	rep := lateResetRun(t, true)
	if !rep.OK() {
		var s strings.Builder
		rep.WriteText(&s)
		t.Fatalf("a RESET written after both items ended both, yet: %s", s.String())
	}
	if rep.Latch.EndedByReset != 2 || rep.Latch.AboveReset != 0 || rep.Latch.Resets != 1 {
		t.Fatalf("latch report %+v, want 2 items ended by the RESET and none above it", rep.Latch)
	}

	rep = lateResetRun(t, false)
	if rep.ViolationsByCheck["breaker.latch_everywhere"] != 1 {
		t.Fatalf("a retry published while an item written after the RESET was open: %d breaker.latch_everywhere violations, want 1: %v",
			rep.ViolationsByCheck["breaker.latch_everywhere"], rep.Violations)
	}
	if rep.ViolationsByCheck["breaker.latch_items"] != 1 {
		t.Fatalf("a released on the RESET while its own item written after it was open: %d breaker.latch_items violations, want 1: %v",
			rep.ViolationsByCheck["breaker.latch_items"], rep.Violations)
	}
	for _, v := range rep.Violations {
		if v.Check == "breaker.latch_everywhere" && (v.Task != "t-1" || !strings.Contains(v.Detail, "task h-2's item") || !strings.Contains(v.Detail, "above the template's RESET at offset 2")) {
			t.Errorf("the violation does not name the retry and the item above the RESET: %+v", v)
		}
	}
	if rep.Latch.EndedByReset != 1 || rep.Latch.AboveReset != 1 {
		t.Fatalf("latch report %+v, want h-1 ended by the RESET and h-2 above it", rep.Latch)
	}
}

// Guards how the breakers topic is read: transactions resolved by their
// markers (an aborted item never held; an item whose marker was not read
// holds nothing, yet its tombstone or RESET may end one), the commit taken
// from the COMMIT marker, an item reopened by its task holding on until a
// later end, the records of a partition other than 0 (an earlier release's)
// ordered before partition 0's, as the routers read them, and a hold whose
// end may lie in offsets never read left unchecked.
func TestBreakerLogHolds(t *testing.T) {
	s := func(d int) time.Time {
		return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Add(time.Duration(d) * time.Second)
	}
	type want struct {
		task      string
		committed time.Time
		to        time.Time
		checked   bool
	}
	cases := []struct {
		name  string
		write func(b *logBuilder)
		want  []want
	}{
		{"an aborted item never holds", func(b *logBuilder) {
			b.breakerRec(event.BreakerItemKey("PROMPT_TEMPLATE", "tpl", "h-1"), itemValue(t, "h-1", s(0)), "a", 7, s(0), time.Time{})
			b.marker(7, s(1), false)
			b.itemCommitted("tpl", "h-2", "a", 7, s(2), s(3), true)
		}, []want{{"h-2", s(3), time.Time{}, true}}},
		{"an open transaction's tombstone ends an item", func(b *logBuilder) {
			b.itemCommitted("tpl", "h-1", "a", 7, s(0), s(1), true)
			b.breakerRec(event.BreakerItemKey("PROMPT_TEMPLATE", "tpl", "h-1"), nil, "b", 8, s(5), time.Time{})
		}, []want{{"h-1", s(1), s(5), true}}},
		{"a reopened item holds until its tombstone", func(b *logBuilder) {
			b.itemCommitted("tpl", "h-1", "a", 7, s(0), s(1), true)
			b.itemCommitted("tpl", "h-1", "a", 7, s(10), s(11), true)
			b.itemCommitted("tpl", "h-1", "a", 7, s(20), s(21), false)
		}, []want{{"h-1", s(1), s(20), true}, {"h-1", s(11), s(20), true}}},
		{"a RESET ends the items before it, not after", func(b *logBuilder) {
			b.itemCommitted("tpl", "h-1", "a", 7, s(0), s(1), true)
			b.reset("tpl", s(5))
			b.itemCommitted("tpl", "h-2", "a", 7, s(3), s(7), true)
		}, []want{{"h-1", s(1), s(5), true}, {"h-2", s(7), time.Time{}, true}}},
		{"an earlier release's partition comes before partition 0", func(b *logBuilder) {
			b.reset("tpl", s(5))
			b.breakerNext = 0
			b.itemCommitted("tpl", "h-1", "a", 7, s(0), s(1), true)
			for _, r := range b.logs.Breakers[2:] {
				r.Partition = 1
			}
		}, []want{{"h-1", s(1), s(5), true}}},
		{"an item behind another instance's open transaction holds once that ends", func(b *logBuilder) {
			// b's transaction (paused) began before a's item and ends 9 s later
			b.breakerRec(event.BreakerStateKey("PROVIDER_MODEL", "acme/m1"), nil, "b", 8, s(0), time.Time{})
			b.itemCommitted("tpl", "h-1", "a", 7, s(1), s(2), true)
			b.marker(8, s(11), false)
		}, []want{{"h-1", s(11), time.Time{}, true}}},
		{"unread offsets after an item leave it unchecked", func(b *logBuilder) {
			b.itemCommitted("tpl", "h-1", "a", 7, s(0), s(1), true)
			b.breakerNext += 3 // a RESET and its marker, and a third record, removed by the log cleaner before they were read
			b.itemCommitted("tpl", "h-2", "a", 7, s(3), s(4), true)
		}, []want{{"h-1", s(1), time.Time{}, false}, {"h-2", s(4), time.Time{}, true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newLog(t)
			tc.write(b)
			c, err := newChecker(b.logs, Options{Policy: policy.Default(), Ingress: "in", Decisions: "decisions"})
			if err != nil {
				t.Fatal(err)
			}
			got := c.latchHolds()["tpl"]
			if len(got) != len(tc.want) {
				t.Fatalf("holds %+v, want %+v", got, tc.want)
			}
			for i, w := range tc.want {
				h := got[i]
				if h.task != w.task || !h.committed.Equal(w.committed) || !h.to.Equal(w.to) || h.checked != w.checked {
					t.Fatalf("hold %d: %+v, want %+v", i, h, w)
				}
			}
		})
	}
}

func itemValue(t *testing.T, task string, at time.Time) []byte {
	v, err := event.EncodeBreakerItem(&event.BreakerItem{Scope: "PROMPT_TEMPLATE", Key: "tpl", TaskID: task, OpenedAt: event.At(at), Instance: "a"})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Guards how the check tells when a template was latched: the union of its
// items' holds; an item opened in the millisecond the last open one was
// decided begins a new stretch (one batch may reopen the template, release
// its held retries and latch it again).
func TestLatchStretches(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := func(d int) time.Time { return t0.Add(time.Duration(d) * time.Second) }
	h := func(from, to time.Time) hold { return hold{from: from, to: to, checked: true} }
	cases := []struct {
		name  string
		holds []hold
		want  [][2]time.Time // from, to (zero: still latched)
	}{
		{"overlapping items are one stretch", []hold{h(s(0), s(10)), h(s(5), s(20))}, [][2]time.Time{{s(0), s(20)}}},
		{"an item opened as the last was decided", []hold{h(s(0), s(10)), h(s(10), time.Time{})}, [][2]time.Time{{s(0), s(10)}, {s(10), {}}}},
		{"an item ended in its own batch holds nothing", []hold{h(s(0), s(0)), h(s(10), s(20))}, [][2]time.Time{{s(10), s(20)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got [][2]time.Time
			for _, st := range stretches(tc.holds) {
				got = append(got, [2]time.Time{st.from, st.to})
			}
			if len(got) != len(tc.want) {
				t.Fatalf("stretches %v, want %v", got, tc.want)
			}
			for i := range got {
				if !got[i][0].Equal(tc.want[i][0]) || !got[i][1].Equal(tc.want[i][1]) {
					t.Fatalf("stretches %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// Guards breaker.item_record: a hallucination that latches its template
// without its item record on the breakers topic is reported (no instance
// but its own would hold the template), and so is a reviewer's decision of
// the item without its tombstone; with both records it passes.
func TestItemRecords(t *testing.T) {
	write := func(t *testing.T, open, tomb bool) *Report {
		b := newLog(t)
		hd, h, st := b.hallucinated(0, "h-1")
		b.latched("h-1", hd.DecidedAt)
		if open {
			b.item("tpl", "h-1", "a", 7, hd.DecidedAt.Time, true)
		}
		b.rejected(0, "h-1", &h, st, b.t0.Add(time.Minute))
		if !tomb { // rejected wrote it: take it back out with its marker
			b.logs.Breakers = b.logs.Breakers[:len(b.logs.Breakers)-2]
		}
		return b.check()
	}
	if rep := write(t, true, true); rep.ViolationsByCheck["breaker.item_record"] != 0 {
		t.Fatalf("both records written, yet: %v", rep.Violations)
	}
	for _, tc := range []struct {
		name       string
		open, tomb bool
		detail     string
	}{
		{"no item", false, true, "no item record"},
		{"no tombstone", true, false, "no tombstone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := write(t, tc.open, tc.tomb)
			if rep.ViolationsByCheck["breaker.item_record"] != 1 {
				t.Fatalf("%d breaker.item_record violations, want 1: %v", rep.ViolationsByCheck["breaker.item_record"], rep.Violations)
			}
			for _, v := range rep.Violations {
				if v.Check == "breaker.item_record" && (v.Task != "h-1" || !strings.Contains(v.Detail, tc.detail)) {
					t.Errorf("the violation does not name the task and what is missing: %+v", v)
				}
			}
		})
	}
}
