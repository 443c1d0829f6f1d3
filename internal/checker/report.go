package checker

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Report is what Check found.
type Report struct {
	// Counts of what was read and decided.
	Inputs, Tasks, Poison, Commands, Decisions, Redrives int
	// Forwarded counts the inputs on the wrong partition for their task;
	// Unwritable the task events too large to be routed (dead-lettered).
	Forwarded, Unwritable                  int
	Audit, Retries, Reviews, DeadLetters   int
	Alerts, SLAAlerts, Surges, Transitions int
	// Superseded retries were replaced by a later decision before they were
	// published; HeldReleased retries were held behind a breaker and
	// published once it closed; HeldExpired retries were held until their
	// task's lifetime ended and given up to the dead-letter topic.
	Superseded, HeldReleased, HeldExpired int
	// Lives counts the inputs decided on a fresh state because their task's
	// state had expired; Reconciled the writes of unknown outcome a
	// reviewer's decision resolved; Tombstones the state changelog's
	// tombstones; Expired the tasks whose state expired long enough before
	// the logs were read that their tombstone must be there.
	Lives, Reconciled, Tombstones, Expired int
	// MaxDecideLagMs is the longest time from an input's production to its
	// decision; MaxRetryLateMs the latest a retry came out after it could.
	MaxDecideLagMs, MaxRetryLateMs int64
	// BreakerStretches counts the stretches of time a breaker was CLOSED
	// on one process, with outcomes, whose windows were recomputed
	// (missing.go); Unchecked those of them, and the surges, left out
	// because decisions of the time are Unattributed (their producer
	// wrote no alert: its instance is unknown).
	BreakerStretches, BreakerStretchesUnchecked, SurgesUnchecked, Unattributed int
	// BreakerTrips counts the stretches that had to end with the breaker
	// opening in a batch, and did; SurgesCertain the batches after which a
	// surge had to be alerted, and was.
	BreakerTrips, SurgesCertain int
	// IdleStretches counts the stretches of OPEN or HALF_OPEN on one
	// instance that nothing used for their breaker's idle time: each had to
	// end (the breaker let go) within RetryLate after that (letgo.go).
	IdleStretches int
	// IdleShared counts the breakers whose last use left them OPEN or
	// HALF_OPEN on the breakers topic and that nothing used for their idle
	// time: each had to have its state tombstoned there within LetGoLate
	// after that (letgo.go).
	IdleShared int
	// ProcessesUnchecked counts the router processes whose windows were
	// not recomputed: they wrote nothing to the alerts topic, or wrote it
	// as an earlier build.
	ProcessesUnchecked int
	// Latch is what the check that a latch holds everywhere saw.
	Latch LatchReach
	// Open is what the check that an ordinary OPEN holds everywhere saw.
	Open OpenReach
	// Routes counts the model's decisions by route.
	Routes map[string]int `json:",omitempty"`
	// Ledger are the cost ledger's sums of the model's decisions.
	Ledger *LedgerSums `json:",omitempty"`
	// Violations are the differences found, at most Options.MaxViolations;
	// ViolationsByCheck counts all of them by check.
	Violations        []Violation
	ViolationsByCheck map[string]int
	// FirstTask is the first task (by its first input) whose outputs differ.
	FirstTask *TaskReport `json:",omitempty"`

	failed map[string]bool
}

// Violation is one difference between the outputs and the model.
type Violation struct {
	Check  string `json:"check"`
	Task   string `json:"task,omitempty"`
	Detail string `json:"detail"`
}

// TaskReport is one task's whole story: its inputs in decision order, the
// outputs the model expects and the ones the router wrote.
type TaskReport struct {
	Task       string      `json:"task"`
	Violations []Violation `json:"violations"`
	Inputs     []Input     `json:"inputs"`
	Expected   []Output    `json:"expected"`
	Actual     []Output    `json:"actual"`
}

// Input is one input record of a task.
type Input struct {
	Record string          `json:"record"` // topic/partition@offset
	Kind   string          `json:"kind"`
	At     string          `json:"produced_at"`
	Value  json.RawMessage `json:"value,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// Output is one output record, written or expected.
type Output struct {
	Topic     topicspec.Short `json:"topic"`
	Input     string          `json:"input,omitempty"`
	Class     string          `json:"class,omitempty"`
	Route     string          `json:"route,omitempty"`
	Rule      string          `json:"rule,omitempty"`
	Retry     int32           `json:"retry_n,omitempty"`
	NotBefore string          `json:"not_before,omitempty"`
	At        string          `json:"at,omitempty"`
	Reason    string          `json:"reason,omitempty"`
	Note      string          `json:"note,omitempty"`
}

// OK reports whether the outputs matched the model.
func (r *Report) OK() bool { return len(r.ViolationsByCheck) == 0 }

func (r *Report) count(d event.Decision) {
	if r.Routes == nil {
		r.Routes = map[string]int{}
	}
	r.Routes[string(d.Route)]++
}

func (c *checker) violate(check, task, format string, args ...any) {
	c.rep.ViolationsByCheck[check]++
	v := Violation{Check: check, Task: task, Detail: fmt.Sprintf(format, args...)}
	if len(c.rep.Violations) < c.o.MaxViolations {
		c.rep.Violations = append(c.rep.Violations, v)
	}
	if c.rep.failed == nil {
		c.rep.failed = map[string]bool{}
	}
	c.rep.failed[task] = true
}

func (c *checker) expected(task string, o Output) {
	if tr := c.tasks[task]; tr != nil {
		tr.expected = append(tr.expected, o)
	}
}

func (c *checker) actual(task string, o Output) {
	if tr := c.tasks[task]; tr != nil {
		tr.actual = append(tr.actual, o)
	}
}

func outputOf(topic topicspec.Short, r *routed, note string) Output {
	o := outputOfDecision(topic, inputKey{r.r.Input.Topic, r.r.Input.Partition, r.r.Input.Offset}, r.r.Decision)
	if r.r.Input.Topic == "" {
		o.Input = ""
	}
	o.At, o.Note = stamp(r.at()), note
	return o
}

func outputOfDecision(topic topicspec.Short, k inputKey, d event.Decision) Output {
	o := Output{Topic: topic, Input: k.String(), Class: string(d.Class), Route: string(d.Route), Rule: d.Rule,
		Reason: d.Reason, At: stamp(d.DecidedAt.Time)}
	if d.Retry != nil {
		o.Retry, o.NotBefore = d.Retry.N, stamp(d.Retry.NotBefore.Time)
	}
	return o
}

// finish picks the first task whose outputs differ and tells its story.
func (c *checker) finish() {
	for _, id := range c.order {
		if !c.rep.failed[id] {
			continue
		}
		tr := c.tasks[id]
		tar := &TaskReport{Task: id, Expected: tr.expected, Actual: tr.actual}
		for _, v := range c.rep.Violations {
			if v.Task == id {
				tar.Violations = append(tar.Violations, v)
			}
		}
		for _, in := range tr.inputs {
			x := Input{Record: in.key.String(), Kind: kindName(in.kind), At: stamp(in.rec.Timestamp)}
			var v any = &in.event
			if in.kind == inReview {
				v = &in.review
			}
			x.Value, _ = json.Marshal(v)
			tar.Inputs = append(tar.Inputs, x)
		}
		c.rep.FirstTask = tar
		return
	}
	if len(c.rep.Violations) > 0 { // only violations outside any task
		v := c.rep.Violations[0]
		c.rep.FirstTask = &TaskReport{Task: v.Task, Violations: []Violation{v}}
	}
}

// WriteText prints the report for a person: the summary, the violations by
// check, and the first failing task's inputs, expected and actual outputs.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "inputs %d (tasks %d, poison %d, breaker commands %d, re-drives %d); audit %d, retry %d (superseded %d, held then released %d, held then given up %d), review %d, deadletter %d, alerts %d (transitions %d, review SLA %d, surge %d)\n",
		r.Inputs, r.Tasks, r.Poison, r.Commands, r.Redrives, r.Audit, r.Retries, r.Superseded, r.HeldReleased, r.HeldExpired, r.Reviews, r.DeadLetters,
		r.Alerts, r.Transitions, r.SLAAlerts, r.Surges)
	fmt.Fprintf(w, "forwarded: %d inputs on the wrong partition for their task; unwritable: %d task events dead-lettered as too large to route\n", r.Forwarded, r.Unwritable)
	fmt.Fprintf(w, "windows: %d CLOSED breaker stretches recomputed (%d opened when their window had to trip, %d unchecked), %d certain surges alerted (%d unchecked), %d decisions of no known instance, %d processes unchecked\n",
		r.BreakerStretches, r.BreakerTrips, r.BreakerStretchesUnchecked, r.SurgesCertain, r.SurgesUnchecked, r.Unattributed, r.ProcessesUnchecked)
	fmt.Fprintf(w, "idle breakers: %d OPEN or HALF_OPEN stretches outlasted their breaker's last use by its idle time, each to be let go; %d shared OPEN or HALF_OPEN states outlasted it, each to be tombstoned\n", r.IdleStretches, r.IdleShared)
	fmt.Fprintf(w, "time: %d inputs decided on a fresh state after their task expired, %d writes reconciled by a reviewer, %d tombstones (%d tasks past their expiry); latest decision %d ms after its input, latest retry %d ms after it could come out\n",
		r.Lives, r.Reconciled, r.Tombstones, r.Expired, r.MaxDecideLagMs, r.MaxRetryLateMs)
	fmt.Fprintf(w, "latches: %s\n", r.Latch)
	if r.Ledger != nil {
		fmt.Fprintf(w, "ledger: %s\n", r.Ledger)
	}
	if r.OK() {
		fmt.Fprintln(w, "every output matches the model")
		return
	}
	checks := make([]string, 0, len(r.ViolationsByCheck))
	for k := range r.ViolationsByCheck {
		checks = append(checks, k)
	}
	slices.Sort(checks)
	fmt.Fprintln(w, "VIOLATIONS by check:")
	for _, k := range checks {
		fmt.Fprintf(w, "  %-28s %d\n", k, r.ViolationsByCheck[k])
	}
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(w, "  ... %d more in the JSON report\n", len(r.Violations)-20)
			break
		}
		fmt.Fprintf(w, "  [%s] task %s: %s\n", v.Check, v.Task, v.Detail)
	}
	t := r.FirstTask
	if t == nil {
		return
	}
	fmt.Fprintf(w, "FIRST FAILING TASK %s\n", t.Task)
	for _, v := range t.Violations {
		fmt.Fprintf(w, "  violation [%s] %s\n", v.Check, v.Detail)
	}
	fmt.Fprintln(w, "  inputs, in the order the router decided them:")
	for _, in := range t.Inputs {
		fmt.Fprintf(w, "    %-32s %-15s produced %s %s\n", in.Record, in.Kind, in.At, in.Value)
	}
	out := func(title string, os []Output) {
		fmt.Fprintln(w, "  "+title+":")
		for _, o := range os {
			var b strings.Builder
			fmt.Fprintf(&b, "    %-10s %-32s %s/%s %s", o.Topic, o.Input, o.Class, o.Route, o.Rule)
			if o.Retry != 0 {
				fmt.Fprintf(&b, " n=%d not_before=%s", o.Retry, o.NotBefore)
			}
			if o.At != "" {
				fmt.Fprintf(&b, " at=%s", o.At)
			}
			if o.Note != "" {
				fmt.Fprintf(&b, " (%s)", o.Note)
			}
			if o.Reason != "" {
				fmt.Fprintf(&b, " %q", o.Reason)
			}
			fmt.Fprintln(w, b.String())
		}
	}
	out("expected outputs", t.Expected)
	out("actual outputs", t.Actual)
}
