package checker

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/task"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Logs are the committed records of one run, read with read_committed.
type Logs struct {
	// Ingress and Decisions are the input topics.
	Ingress, Decisions []*kgo.Record
	// Audit, Retry, Review, DeadLetter and Alerts are the output topics.
	Audit, Retry, Review, DeadLetter, Alerts []*kgo.Record
	// State is the task-state changelog, optional: with it the model checks
	// the router's tombstones against each task's expiry.
	State []*kgo.Record
	// Breakers is the breakers topic (one partition) from offset 0, read
	// with read_uncommitted and its control records kept, in any order: the
	// authority for latches (breakerlog.go). Read as it is written, from
	// before the first router starts, since the log cleaner compacts it
	// under the routers. Optional: without it the latch checks
	// (latchreach.go, breaker.latch_items) are not made.
	Breakers []*kgo.Record
	// End is when the logs were read: every committed output is older.
	End time.Time
}

// Options configure Check.
type Options struct {
	// Policy is the policy the router ran with. Required.
	Policy *policy.Policy
	// Ingress and Decisions are the full names of the input topics. Required.
	Ingress, Decisions string
	// MaxRecordBytes is the router's --max-record-bytes. Default 512 KiB.
	MaxRecordBytes int
	// Settle is how long past its owner's SLA an open review item may wait
	// for its alert (the router looks on every poll; a killed or paused
	// instance looks later). Default 90 s.
	Settle time.Duration
	// MaxViolations bounds the violations kept in the report. Default 1000.
	MaxViolations int
	// RetryLate bounds how late a retry may be published after it could be
	// (its due time, or the moment the breakers it goes into closed): the
	// router looks for due retries on every poll, and a partition that moves
	// (a session timeout, a restore) takes some seconds; a retry held behind
	// a breaker by a process that stopped comes out on the process that
	// restores it at its moved time, up to a cooldown later. Default 60 s
	// plus the policy's longest breaker cooldown.
	RetryLate time.Duration
	// LetGoLate bounds how late, after its idle time, a breaker no one
	// uses is let go and its failure-rate state tombstoned on the breakers
	// topic (breaker.shared_not_let_go): a router looks for idle breakers
	// every 10 s, at the start of a batch, and the tombstone commits with
	// the batch. Default 20 s.
	LetGoLate time.Duration
	// DecideLate bounds how long after an input was produced its decision
	// may be: the model takes each decision's time from its audit record
	// only within [produced, produced + DecideLate]. Default 3 min.
	DecideLate time.Duration
	// ExpiryLate is how long after a task's state expired its tombstone may
	// wait on the changelog (an expiry bucket, a poll, a moved partition).
	// Default 45 s plus the router's expiry bucket (2 x default_sla_ms / 24,
	// within 1 s and 1 h).
	ExpiryLate time.Duration
	// Partitions is the router's home partition count (its state topic's):
	// a task event or review decision on another partition than murmur2 of
	// its key over it is forwarded there (forward.go). 0: not checked, every
	// input is taken to be on its task's partition.
	Partitions int32
	// MaxOutputBytes is the smallest max.message.bytes of the topics the
	// router writes (retry, review, audit, deadletter, alerts, state): a
	// task event too large to be routed under it is dead-lettered
	// (unwritable.go). 0: no input is taken to be unwritable.
	MaxOutputBytes int
	// Starts are the times a process of each router instance (by instance
	// ID) started, as the fault injector knows them. Breakers live in a
	// process's memory: a new process starts with every breaker CLOSED.
	Starts map[string][]time.Time
	// Stops are the times a process of each router instance stopped with
	// no process of it started after (a scale-down), as the fault
	// injector knows them: its breakers went with it.
	Stops map[string][]time.Time
	// Rebalances are other times the group's assignment may have begun to
	// move, as the fault injector knows them: a member paused past its
	// session timeout or resumed, a member stopped, the broker restarted.
	// Like a process start, each exempts the retries it may have moved from
	// breaker.held_order (joined).
	Rebalances []time.Time
	// MixedReleases reports that the run mixes in the previous release,
	// whose audit records claim cost prevented per stop and name no repeat
	// of an attempt: the cost ledger (ledger.go) is then not checked.
	MixedReleases bool
	// SharesLatches reports whether the router process of an instance that
	// ran at a time shares its latches with the other instances (a release
	// with the breakers topic and its latch items). Nil: every process does.
	// A run that mixes in an older release leaves that release's latches, and
	// the retries it published, out of breaker.latch_everywhere (the
	// per-instance checks still apply).
	SharesLatches func(instance string, at time.Time) bool
}

// inputKind is what one input record is.
type inputKind uint8

const (
	inTask       inputKind = iota // a TaskEvent on ingress
	inReview                      // a ReviewDecision on decisions
	inCommand                     // a breaker command (BreakerEvent of kind RESET or LATCH) on decisions
	inPoison                      // a record the router must dead-letter
	inForward                     // a task event or review decision on the wrong partition for its task, forwarded to it (forward.go)
	inUnwritable                  // a task event whose routed records could not be written: dead-lettered (unwritable.go)
)

// inputKey names an input record.
type inputKey struct {
	topic     string
	partition int32
	offset    int64
}

func (k inputKey) String() string { return fmt.Sprintf("%s/%d@%d", k.topic, k.partition, k.offset) }

// input is one input record as the model reads it.
type input struct {
	rec     *kgo.Record
	key     inputKey
	kind    inputKind
	event   event.TaskEvent
	review  event.ReviewDecision
	command event.BreakerEvent
	errKind string
	err     error
	task    string  // task ID; the record key for poison and commands
	home    int32   // the task's partition, of an inForward input
	audit   *routed // its audit record, nil if none
	decided event.Decision
	// repeat is why the model does not count the usage of a decided task
	// event (policy.RepeatOf; a forward's is policy.RepeatForwarded)
	repeat policy.Repeat
	// fresh: the model forgot the task's state (its TTL) before deciding
	// this input; estimated: a replay took the publication time of a retry
	// of the task that the retry topic does not hold for its expiry
	// (replayPublished)
	fresh, estimated bool
}

// routed is a decoded output record.
type routed struct {
	rec *kgo.Record
	r   event.Routed
}

func (r *routed) at() time.Time { return r.r.Decision.DecidedAt.Time }

// checker is one run of Check.
type checker struct {
	o     Options
	codec *codec.Codec
	logs  Logs
	rep   *Report

	inputs   map[inputKey]*input
	tasks    map[string]*taskRun
	order    []string                      // task IDs in order of their first input
	retries  map[retryKey][]*expectRetry   // a re-drive reopens a task: its retry numbers start again
	reviews  map[inputKey]*input           // inputs that must have a review record
	dead     map[inputKey]*input           // inputs that must have a dead-letter record
	alerts   map[alertKey]int              // immediate alerts that must be on the alerts topic
	items    []*reviewItem                 // review items and their SLA clocks
	decision map[decisionKey][]event.Class // the classes a task was decided at a time
	// instances names the instance of each producer ID (from its alerts)
	instances map[int64]string
	// latchCommands are the LATCH commands applied: task, time
	latchCommands map[decisionKey]bool
	// latchDecisions are the hallucinations that latch their template: each
	// writes its item on the breakers topic (latchreach.go)
	latchDecisions []latchDecision
	// holds are, per prompt template, the holds of its latch items, and
	// resets the RESET records of every breaker, read from the breakers
	// topic (breakerlog.go)
	holds    map[string][]hold
	resets   map[breaker.Ref][]resetRec
	itemSeen map[itemSeen]bool
	// forwarded are the records the router forwarded to their task's
	// partition, with their copies
	forwarded map[inputKey]inputKey
	// pubs are the publication times of each task's retries (lifetime.go)
	pubs map[string][]published
	// batches are the times each instance's batches ran (latchreach.go)
	batches map[string][]time.Time
	// replay: the checker runs for Replay, whose retries may be another
	// policy's (replayPublished); estimated is set when one was estimated
	replay, estimated bool
}

// taskRun is the model's walk of one task.
type taskRun struct {
	id       string
	inputs   []*input
	st       task.State
	expected []Output
	actual   []Output
	failed   bool
	// touches are the model's state after each decision, for its expiry
	// (lifetime.go); stopped: an input has no audit record, the model could
	// not go on
	touches []touch
	stopped bool
}

// Check recomputes every output of logs with the policy and reports where
// the router's outputs differ.
func Check(logs Logs, o Options) (*Report, error) {
	ck, err := newChecker(logs, o)
	if err != nil {
		return nil, err
	}
	ck.readInputs()
	ck.readAudit()
	ck.indexPublished() // lifetime.go
	ck.model()
	ck.checkRouted()
	ck.checkRetries()
	ck.checkAlerts()
	ck.checkMissing()    // missing.go
	ck.latchEverywhere() // latchreach.go
	ck.checkTombstones() // lifetime.go
	ck.checkForwarded()  // forward.go
	ck.checkLedger()     // ledger.go
	ck.finish()
	return ck.rep, nil
}

// newChecker validates o, fills in its defaults and returns a checker of logs.
func newChecker(logs Logs, o Options) (*checker, error) {
	if o.Policy == nil || o.Ingress == "" || o.Decisions == "" {
		return nil, errors.New("checker: Options: Policy, Ingress and Decisions are required")
	}
	if o.MaxRecordBytes == 0 {
		o.MaxRecordBytes = 512 << 10
	}
	if o.Settle == 0 {
		o.Settle = 90 * time.Second
	}
	if o.MaxViolations == 0 {
		o.MaxViolations = 1000
	}
	if o.RetryLate == 0 {
		cooldown := func(b *policy.Breakers) int64 {
			return max(b.ProviderModel.CooldownMs, b.Downstream.CooldownMs, b.PromptTemplate.CooldownMs)
		}
		longest := cooldown(&o.Policy.Breakers)
		for i := range o.Policy.Overrides { // breaker limits of their own
			if b := o.Policy.Overrides[i].Breakers; b != nil {
				longest = max(longest, cooldown(b))
			}
		}
		o.RetryLate = 60*time.Second + time.Duration(longest)*time.Millisecond
	}
	if o.LetGoLate == 0 {
		o.LetGoLate = 20 * time.Second
	}
	if o.DecideLate == 0 {
		o.DecideLate = 3 * time.Minute
	}
	if o.ExpiryLate == 0 {
		bucket := min(max(time.Duration(2*o.Policy.DefaultSLAMs/24)*time.Millisecond, time.Second), time.Hour)
		o.ExpiryLate = 45*time.Second + bucket
	}
	c, err := codec.New()
	if err != nil {
		return nil, err
	}
	return &checker{
		o: o, codec: c, logs: logs, rep: &Report{ViolationsByCheck: map[string]int{}},
		inputs: map[inputKey]*input{}, tasks: map[string]*taskRun{},
		retries: map[retryKey][]*expectRetry{}, reviews: map[inputKey]*input{}, dead: map[inputKey]*input{},
		alerts: map[alertKey]int{}, decision: map[decisionKey][]event.Class{}, latchCommands: map[decisionKey]bool{},
		forwarded: map[inputKey]inputKey{},
	}, nil
}

// readInputs decodes every input record the way the router must.
func (c *checker) readInputs() {
	read := func(recs []*kgo.Record) {
		for _, rec := range recs {
			in := c.decode(rec)
			c.inputs[in.key] = in
			c.rep.Inputs++
			// without a fixed partition count (Options.Partitions 0) the
			// router's copies say which inputs were misplaced
			if to, ok := c.forwarded[in.key]; ok && c.o.Partitions <= 0 && (in.kind == inTask || in.kind == inReview) {
				in.kind, in.home = inForward, to.partition // the copy is routed, on the task's partition
			}
			switch in.kind {
			case inTask, inReview:
				tr := c.tasks[in.task]
				if tr == nil {
					tr = &taskRun{id: in.task}
					c.tasks[in.task] = tr
				}
				tr.inputs = append(tr.inputs, in)
			case inPoison:
				c.rep.Poison++
			case inUnwritable:
				c.rep.Unwritable++
			case inForward:
				c.rep.Forwarded++
			case inCommand:
				c.rep.Commands++
			}
		}
	}
	// the records the router forwarded: their copies name them
	for _, recs := range [][]*kgo.Record{c.logs.Ingress, c.logs.Decisions} {
		for _, rec := range recs {
			if topic, p, o, ok := codec.ParseForwardedFrom(rec.Headers); ok {
				c.forwarded[inputKey{topic, p, o}] = inputKey{rec.Topic, rec.Partition, rec.Offset}
			}
		}
	}
	read(c.logs.Ingress)
	read(c.logs.Decisions)
	c.rep.Tasks = len(c.tasks)
}

// decode classifies one input record as the router's contract says:
// oversize, no key, undecodable, a key that is not the task ID: poison.
func (c *checker) decode(rec *kgo.Record) *input {
	in := &input{rec: rec, key: inputKey{rec.Topic, rec.Partition, rec.Offset}, task: string(rec.Key)}
	poison := func(kind string, err error) *input {
		in.kind, in.errKind, in.err = inPoison, kind, err
		return in
	}
	if len(rec.Value) > c.o.MaxRecordBytes {
		return poison("oversize", fmt.Errorf("%d bytes", len(rec.Value)))
	}
	if len(rec.Key) == 0 {
		return poison("empty_key", errors.New("no key"))
	}
	var id string
	if rec.Topic == c.o.Decisions {
		v, err := c.codec.Decode(rec.Value)
		if err != nil {
			return poison(codec.Kind(err), err)
		}
		switch x := v.(type) {
		case *event.ReviewDecision:
			in.kind, in.review, id = inReview, *x, x.TaskID
		case *event.BreakerEvent:
			if x.Kind != event.BreakerKindReset && x.Kind != event.BreakerKindLatch {
				return poison(codec.Kind(codec.ErrWrongSchema), errors.New("breaker event of kind "+x.Kind))
			}
			in.kind, in.command = inCommand, *x
			return in
		default:
			return poison(codec.Kind(codec.ErrWrongSchema), fmt.Errorf("%T on decisions", v))
		}
	} else {
		ev, err := c.codec.DecodeTaskEvent(rec.Value)
		if err != nil {
			return poison(codec.Kind(err), err)
		}
		in.kind, in.event, id = inTask, ev, ev.TaskID
	}
	if string(rec.Key) != id {
		return poison("key_mismatch", fmt.Errorf("key %q, task_id %q", rec.Key, id))
	}
	in.task = id
	if home, ok := c.misplaced(rec); ok { // forward.go
		in.kind, in.home = inForward, home
	} else if in.kind == inTask && c.unwritable(rec) { // unwritable.go
		in.kind, in.errKind = inUnwritable, kindTooLarge
	}
	return in
}

// readAudit pairs every audit record with its input: exactly one each.
func (c *checker) readAudit() {
	for _, rec := range c.logs.Audit {
		c.rep.Audit++
		r, ok := c.routed(topicspec.Audit, rec)
		if !ok {
			continue
		}
		k := inputKey{r.r.Input.Topic, r.r.Input.Partition, r.r.Input.Offset}
		in := c.inputs[k]
		switch {
		case in == nil:
			c.violate("audit.extra", taskOf(r), "audit %d@%d names input %s, which is not a committed input record", rec.Partition, rec.Offset, k)
		case in.audit != nil:
			c.violate("audit.duplicate", in.task, "input %s has a second audit record at audit %d@%d (the first at %d@%d)",
				k, rec.Partition, rec.Offset, in.audit.rec.Partition, in.audit.rec.Offset)
			c.actual(in.task, outputOf(topicspec.Audit, r, "DUPLICATE"))
		default:
			in.audit = r
		}
	}
}

// routed decodes an output record of the RoutedRecord schema.
func (c *checker) routed(topic topicspec.Short, rec *kgo.Record) (*routed, bool) {
	r, err := c.codec.DecodeRouted(rec.Value)
	if err != nil {
		c.violate(string(topic)+".undecodable", string(rec.Key), "%s %d@%d does not decode: %v", topic, rec.Partition, rec.Offset, err)
		return nil, false
	}
	return &routed{rec: rec, r: r}, true
}

func taskOf(r *routed) string {
	if r.r.Event != nil {
		return r.r.Event.TaskID
	}
	return string(r.rec.Key)
}

// model walks every task's inputs in the order the router decided them,
// with the policy, and records what each decision must have produced.
func (c *checker) model() {
	for _, in := range c.inputs {
		if in.kind == inPoison || in.kind == inCommand || in.kind == inForward || in.kind == inUnwritable {
			c.untasked(in)
		}
	}
	for _, tr := range c.tasks {
		tr.inputs = c.inputOrder(tr.inputs)
		c.walk(tr)
	}
	// tasks in the order of their first input, for "the first task that differs"
	for id := range c.tasks {
		c.order = append(c.order, id)
	}
	first := func(tr *taskRun) time.Time {
		t := tr.inputs[0].rec.Timestamp
		for _, in := range tr.inputs {
			if in.rec.Timestamp.Before(t) {
				t = in.rec.Timestamp
			}
		}
		return t
	}
	slices.SortFunc(c.order, func(a, b string) int {
		return cmp.Or(first(c.tasks[a]).Compare(first(c.tasks[b])), cmp.Compare(a, b))
	})
}

// inputOrder is the order the model decides a task's inputs in, taken from
// the committed input log: each topic's records in offset order, the two
// topics merged by decision time (two inputs decided in the same millisecond
// were in one poll: by their audit records' order), the inputs without an
// audit record last. walk checks that the audit agrees.
func (c *checker) inputOrder(ins []*input) []*input {
	var audited, rest []*input
	for _, in := range ins {
		if in.audit != nil {
			audited = append(audited, in)
		} else {
			rest = append(rest, in)
		}
	}
	byTopic := map[string][]*input{}
	var topics []string
	for _, in := range audited {
		if byTopic[in.key.topic] == nil {
			topics = append(topics, in.key.topic)
		}
		byTopic[in.key.topic] = append(byTopic[in.key.topic], in)
	}
	slices.Sort(topics)
	for _, t := range topics {
		slices.SortFunc(byTopic[t], func(a, b *input) int { return cmp.Compare(a.key.offset, b.key.offset) })
	}
	before := func(a, b *input) bool { // a decided before b
		return cmp.Or(a.audit.at().Compare(b.audit.at()), cmp.Compare(a.audit.rec.Partition, b.audit.rec.Partition),
			cmp.Compare(a.audit.rec.Offset, b.audit.rec.Offset)) < 0
	}
	out := make([]*input, 0, len(ins))
	for {
		var next string
		for _, t := range topics {
			if q := byTopic[t]; len(q) > 0 && (next == "" || before(q[0], byTopic[next][0])) {
				next = t
			}
		}
		if next == "" {
			break
		}
		out = append(out, byTopic[next][0])
		byTopic[next] = byTopic[next][1:]
	}
	slices.SortFunc(rest, func(a, b *input) int {
		return cmp.Or(cmp.Compare(a.key.topic, b.key.topic), cmp.Compare(a.key.offset, b.key.offset))
	})
	return append(out, rest...)
}

// untasked checks the audit record of a poison record or a breaker command
// (its class, route and rule: the reason of a command says whether it
// changed the breaker of the instance that read it).
func (c *checker) untasked(in *input) {
	var at time.Time
	if in.audit != nil {
		at = in.audit.at()
	}
	var want event.Decision
	switch in.kind {
	case inPoison:
		want = policy.Poison(in.errKind, in.err, at)
		c.dead[in.key] = in
	case inUnwritable:
		want = unwritableDecision(in)
		c.dead[in.key] = in
	case inForward:
		to, ok := c.forwarded[in.key]
		if ok && to.topic != in.key.topic {
			c.violate("forward.topic", in.task, "input %s was forwarded to %s, another topic", in.key, to)
		}
		want = policy.Forward(in.task, in.key.topic, in.key.partition, in.home, c.o.Partitions, at)
		if in.rec.Topic == c.o.Ingress {
			in.repeat = policy.RepeatForwarded // its copy is the attempt
		}
	case inCommand:
		ref, invalid := policy.BreakerCommand(&in.command, at)
		if invalid != nil {
			want = *invalid
		} else {
			want = policy.BreakerCommandApplied(&in.command, ref, true, at)
			if in.command.Kind == event.BreakerKindLatch {
				c.latchCommands[decisionKey{in.command.TaskID, at.UnixMilli()}] = true
			}
		}
	}
	in.decided = want
	exp := Output{Topic: topicspec.Audit, Input: in.key.String(), Class: string(want.Class), Route: string(want.Route), Rule: want.Rule}
	c.expected(in.task, exp)
	if in.kind == inPoison || in.kind == inUnwritable {
		c.expected(in.task, Output{Topic: topicspec.DeadLetter, Input: in.key.String(), Class: string(want.Class), Route: string(want.Route), Rule: want.Rule})
	}
	if in.audit == nil {
		c.violate("audit.missing", in.task, "input %s (%s) has no audit record", in.key, kindName(in.kind))
		return
	}
	got := in.audit.r.Decision
	c.actual(in.task, outputOf(topicspec.Audit, in.audit, ""))
	if got.Class != want.Class || got.Route != want.Route || got.Rule != want.Rule {
		c.violate("audit.decision", in.task, "input %s (%s): audited %s/%s rule %s, want %s/%s rule %s (reason %q)",
			in.key, kindName(in.kind), got.Class, got.Route, got.Rule, want.Class, want.Route, want.Rule, got.Reason)
	}
	if in.kind == inForward {
		c.checkRepeat(in.task, in) // ledger.go
	}
	c.window(in, nil)
}

func kindName(k inputKind) string {
	switch k {
	case inTask:
		return "task event"
	case inReview:
		return "review decision"
	case inCommand:
		return "breaker command"
	case inForward:
		return "misplaced input"
	case inUnwritable:
		return "unwritable task event"
	}
	return "poison"
}

// window checks that a decision's time lies within its input's commit
// window and after the task's previous decision.
func (c *checker) window(in *input, prev *time.Time) {
	at := in.audit.at()
	if lag := at.Sub(in.rec.Timestamp).Milliseconds(); lag > c.rep.MaxDecideLagMs {
		c.rep.MaxDecideLagMs = lag
	}
	switch {
	case at.Before(in.rec.Timestamp.Truncate(time.Millisecond)):
		c.violate("time.window", in.task, "input %s produced at %s was decided at %s, before it existed",
			in.key, in.rec.Timestamp.UTC().Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
	case at.Sub(in.rec.Timestamp) > c.o.DecideLate:
		c.violate("time.late", in.task, "input %s produced at %s was decided at %s, %s later; bound %s",
			in.key, in.rec.Timestamp.UTC().Format(time.RFC3339Nano), at.Format(time.RFC3339Nano), at.Sub(in.rec.Timestamp).Round(time.Millisecond), c.o.DecideLate)
	case !c.logs.End.IsZero() && at.After(c.logs.End):
		c.violate("time.window", in.task, "input %s was decided at %s, after the logs were read (%s)",
			in.key, at.Format(time.RFC3339Nano), c.logs.End.UTC().Format(time.RFC3339Nano))
	case prev != nil && at.Before(*prev):
		c.violate("time.order", in.task, "input %s was decided at %s, before the task's previous decision (%s)",
			in.key, at.Format(time.RFC3339Nano), prev.Format(time.RFC3339Nano))
	}
}

// walk replays one task through the policy.
func (c *checker) walk(tr *taskRun) {
	st := &tr.st
	var prev *time.Time
	var prevAudit *routed
	var item *reviewItem
	reconciled := map[string]time.Time{} // writes a reviewer reconciled, by op ID (lifetime.go)
	var pendSince time.Time
	for _, in := range tr.inputs {
		if in.audit == nil {
			c.violate("audit.missing", tr.id, "input %s (%s) has no audit record; the model cannot go on with this task", in.key, kindName(in.kind))
			c.expected(tr.id, Output{Topic: topicspec.Audit, Input: in.key.String(), Note: "an audit record"})
			tr.stopped = true
			return
		}
		if p := prevAudit; p != nil && p.rec.Partition == in.audit.rec.Partition && p.rec.Offset > in.audit.rec.Offset {
			c.violate("audit.order", tr.id, "input %s was audited at %d@%d, before the input the log puts first (audited at %d@%d)",
				in.key, in.audit.rec.Partition, in.audit.rec.Offset, p.rec.Partition, p.rec.Offset)
		}
		prevAudit = in.audit
		c.window(in, prev)
		at := in.audit.at()
		prev = &at

		// the TTL: an input after the task's state expired is decided on a
		// fresh state (lifetime.go)
		c.estimated = false
		if n := len(tr.touches); n > 0 {
			e, why := c.expiry(tr.id, tr.touches[n-1], at)
			in.estimated = c.estimated
			if why == "" && e <= at.UnixMilli() {
				in.fresh = true
				c.expected(tr.id, Output{Topic: topicspec.State, Input: in.key.String(), At: stamp(time.UnixMilli(e)),
					Note: fmt.Sprintf("expired (last touched %s, SLA %dms): decided on a fresh state", stamp(tr.touches[n-1].at), tr.touches[n-1].slaMs)})
				*st, item = task.State{}, nil
				clear(reconciled)
				c.rep.Lives++
			}
		}

		pending, unknown := st.Pending, unknownWrites(st)
		var want event.Decision
		var ev *event.TaskEvent // the event a retry of this decision re-issues
		switch in.kind {
		case inTask:
			want = c.decideEvent(in, st, at) // and the ledger's view of it (ledger.go)
			ev = &in.event
		case inReview:
			want = c.o.Policy.DecideReview(&in.review, st, at)
			ev = st.LastEvent
		}
		in.decided = want
		c.reconcile(tr.id, in, &want, st, at, unknown, reconciled) // lifetime.go
		if st.Pending != nil && st.Pending != pending {
			pendSince = at
		}
		k := touch{at: at, slaMs: c.slaOf(st), unresolved: unresolved(st, reconciled), pendSince: pendSince}
		if st.Pending != nil {
			k.pending, k.pendN, k.pendDue = true, st.Pending.N, time.UnixMilli(st.Pending.NotBefore)
		}
		// a decision that leaves no task (a review of a task the router
		// does not know) writes no state: the task's expiry stays
		if st.TaskID != "" {
			tr.touches = append(tr.touches, k)
		}
		c.rep.Decisions++
		c.rep.count(want)
		dk := decisionKey{tr.id, at.UnixMilli()}
		c.decision[dk] = append(c.decision[dk], want.Class)
		got := in.audit.r.Decision
		c.expected(tr.id, outputOfDecision(topicspec.Audit, in.key, want))
		c.actual(tr.id, outputOf(topicspec.Audit, in.audit, ""))
		if diff := diffDecision(got, want); diff != "" {
			c.violate("audit.decision", tr.id, "input %s (%s): %s", in.key, kindName(in.kind), diff)
		}
		if in.kind == inTask {
			c.checkPrevented(tr.id, in, &got, &want) // ledger.go
			c.checkRepeat(tr.id, in)
		}
		if in.kind == inTask && in.audit.r.Event != nil && in.audit.r.Event.EventID != in.event.EventID {
			c.violate("audit.event", tr.id, "audit of input %s carries event %s, want %s", in.key, in.audit.r.Event.EventID, in.event.EventID)
		}

		// a later decision that replaced the pending retry supersedes it
		if pending != nil && st.Pending != pending {
			if xs := c.retries[retryKey{tr.id, pending.N}]; len(xs) > 0 && xs[len(xs)-1].superseded == nil {
				x := xs[len(xs)-1]
				t := at
				x.superseded = &t
			}
		}
		switch want.Route {
		case event.RouteRetry:
			x := &expectRetry{task: tr.id, n: want.Retry.N, notBefore: want.Retry.NotBefore.Time, decided: at,
				class: st.LastClass, input: in, partition: in.rec.Partition, slaMs: c.slaOf(st)}
			if ev != nil {
				x.eventID, x.refs = ev.EventID, refs(ev)
			}
			k := retryKey{tr.id, want.Retry.N}
			c.retries[k] = append(c.retries[k], x)
			c.expected(tr.id, Output{Topic: topicspec.Retry, Input: in.key.String(), Class: string(x.class), Route: "RETRY",
				Retry: x.n, NotBefore: stamp(x.notBefore), Note: "once, at or after not_before, unless a later decision supersedes it"})
		case event.RouteReview, event.RouteQuarantine:
			c.reviews[in.key] = in
			c.expected(tr.id, outputOfDecision(topicspec.Review, in.key, want))
		case event.RouteDeadLetter:
			c.dead[in.key] = in
			c.expected(tr.id, outputOfDecision(topicspec.DeadLetter, in.key, want))
		}
		// a hallucination that latches its template writes its item on the
		// breakers topic; a reviewer's decision of it, its tombstone
		// (latchreach.go)
		switch {
		case in.kind == inTask && want.Route != event.RouteDrop:
			if ref, ok := policy.LatchesTemplate(&in.event, want.Class); ok {
				c.latchDecisions = append(c.latchDecisions, latchDecision{task: tr.id, template: ref.Key, at: at, producer: in.audit.rec.ProducerID, open: true})
			}
		case in.kind == inReview:
			if ref, ok := policy.ReviewResetsTemplate(&want, ev); ok {
				c.latchDecisions = append(c.latchDecisions, latchDecision{task: tr.id, template: ref.Key, at: at, producer: in.audit.rec.ProducerID})
			}
		}
		if in.kind == inTask && want.Route != event.RouteDrop {
			switch want.Class {
			case event.ClassHallucination:
				key := in.event.PromptTemplate
				if key == "" {
					key = "(none)"
				}
				c.alerts[alertKey{breaker.PromptTemplate.Name(), key, tr.id, at.UnixMilli()}]++
				c.expected(tr.id, Output{Topic: topicspec.Alerts, Class: string(want.Class), Rule: "ALERT PROMPT_TEMPLATE/" + key, At: stamp(at)})
			case event.ClassBudgetExhausted:
				c.alerts[alertKey{breaker.ScopeTask, tr.id, tr.id, at.UnixMilli()}]++
				c.expected(tr.id, Output{Topic: topicspec.Alerts, Class: string(want.Class), Rule: "ALERT TASK/" + tr.id, At: stamp(at)})
			}
		}

		// the review item's SLA clock, as the router keeps it: an item opens
		// when the task's review opens and none is open (a re-drive closes
		// the open one: Reopen clears its due time), and keeps its due time
		// while later decisions of the task keep it open, its class
		// following theirs
		if in.kind == inReview || want.Route != event.RouteDrop {
			closeItem := func() {
				if item != nil {
					t := at
					item.closed = &t
					item = nil
				}
			}
			switch {
			case st.Review != task.ReviewOpen:
				closeItem()
				st.ReviewDueAt = 0
			case st.ReviewDueAt == 0 && want.Review != nil && want.Review.SLAMs > 0:
				closeItem()
				item = &reviewItem{task: tr.id, class: st.ReviewClass, opened: at,
					due: at.Add(time.Duration(want.Review.SLAMs) * time.Millisecond)}
				st.ReviewDueAt = item.due.UnixMilli()
				c.items = append(c.items, item)
			case item != nil && st.ReviewClass != item.classAt(at):
				item.classes = append(item.classes, classAt{at, st.ReviewClass})
			}
		}
	}
}

// diffDecision names the first difference between the audited decision and
// the model's, or "".
func diffDecision(got, want event.Decision) string {
	switch {
	case got.Class != want.Class || got.Route != want.Route || got.Rule != want.Rule:
		return fmt.Sprintf("audited %s/%s rule %s (%q), want %s/%s rule %s (%q)",
			got.Class, got.Route, got.Rule, got.Reason, want.Class, want.Route, want.Rule, want.Reason)
	case got.Override != want.Override:
		return fmt.Sprintf("decided under override %s, want %s", overrideName(got.Override), overrideName(want.Override))
	case got.Reason != want.Reason:
		return fmt.Sprintf("reason %q, want %q", got.Reason, want.Reason)
	case (got.Retry == nil) != (want.Retry == nil):
		return fmt.Sprintf("retry plan %s, want %s", plan(got.Retry), plan(want.Retry))
	case got.Retry != nil && (got.Retry.N != want.Retry.N || got.Retry.DelayMs != want.Retry.DelayMs ||
		!got.Retry.NotBefore.Equal(want.Retry.NotBefore.Time)):
		return fmt.Sprintf("retry plan %s, want %s", plan(got.Retry), plan(want.Retry))
	case got.Totals != want.Totals:
		return fmt.Sprintf("totals %+v, want %+v", got.Totals, want.Totals)
	case (got.Review == nil) != (want.Review == nil) || got.Review != nil && *got.Review != *want.Review:
		return fmt.Sprintf("review %+v, want %+v", got.Review, want.Review)
	case got.Feedback != want.Feedback || got.SuggestedModel != want.SuggestedModel || got.UserMessage != want.UserMessage:
		return fmt.Sprintf("feedback/suggested model/user message %q/%q/%q, want %q/%q/%q",
			got.Feedback, got.SuggestedModel, got.UserMessage, want.Feedback, want.SuggestedModel, want.UserMessage)
	}
	return ""
}

func overrideName(name string) string {
	if name == "" {
		return "none (the base policy)"
	}
	return name
}

func plan(p *event.RetryPlan) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("n=%d delay=%dms not_before=%s", p.N, p.DelayMs, stamp(p.NotBefore.Time))
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// decideEvent is the router's contract for one task event, the policy's
// DecideEvent: an exact redelivery is dropped; a re-driven event
// (faultrouter.redrive.* headers) reopens the task and is decided afresh; the
// same re-drive delivered twice is dropped.
//
// It also sets what the ledger makes of the decision (pkg/policy's
// prevented.go): whether its attempt repeats one already counted
// (in.repeat), and the cost prevented it claims, the change of the task's
// standing (the decision's Prevented, which diffDecision does not compare).
func (c *checker) decideEvent(in *input, st *task.State, at time.Time) event.Decision {
	rd := codec.ParseHeaders(in.rec.Headers).Redrive
	if rd != nil {
		c.rep.Redrives++
	}
	p := c.o.Policy
	known, standing := st.TaskID != "", p.StandingOf(st)
	d := p.DecideEvent(&in.event, st, rd, at)
	if d.Route != event.RouteDrop {
		in.repeat = p.RepeatOf(&in.event, rd != nil, known, in.rec.Timestamp)
		d.Prevented = p.Claim(standing, p.StandingOf(st), &d)
	}
	return d
}
