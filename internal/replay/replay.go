// Package replay is incident analysis over committed records: parsing a time
// range, turning consumed records into steps (decode.go), filtering them,
// ordering one task's timeline, and the lineage headers and guards of a
// re-drive (the header contract itself is pkg/codec's headers.go), all pure; read.go reads a time range of topics from Kafka. The
// replay verb and the operator console (internal/console) share it; internal/control
// writes the re-drive.
package replay

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// ErrBadTime is returned by ParseTime for a value that is neither RFC 3339
// nor a relative duration.
var ErrBadTime = errors.New("replay: time is neither RFC 3339 nor a relative duration like -2h")

// ParseTime reads a range bound: an RFC 3339 time, "now", or a duration
// relative to now ("-2h", "-30m", "-7d" for whole days; a duration without
// sign also counts back).
func ParseTime(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "now" {
		return now, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	rel := strings.TrimPrefix(s, "-")
	if days, ok := strings.CutSuffix(rel, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 && n <= 100*365 {
			return now.AddDate(0, 0, -n), nil
		}
	}
	d, err := time.ParseDuration(rel)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%w: %q", ErrBadTime, s)
	}
	return now.Add(-d), nil
}

// Kind is what a step's record holds.
type Kind string

// Kinds of steps.
const (
	KindEvent    Kind = "event"    // a TaskEvent (ingress, or a re-driven event)
	KindRouted   Kind = "routed"   // a Routed record (audit, retry, review, dead letter)
	KindBreaker  Kind = "alert"    // a BreakerEvent
	KindReview   Kind = "decision" // a ReviewDecision
	KindPoison   Kind = "poison"   // a dead-lettered raw input (original bytes)
	KindUnusable Kind = "error"    // a record that does not decode
)

// Step is one record of a topic in the shape replay filters, orders and
// prints.
type Step struct {
	Topic     string
	Short     topicspec.Short // ingress, audit, ...; empty when unknown
	Partition int32
	Offset    int64
	Timestamp time.Time
	Kind      Kind
	TaskID    string
	// Event is the task event of an event or routed step (nil otherwise).
	Event *event.TaskEvent
	// Decision is set on routed steps.
	Decision *event.Decision
	// Summary says what happened in a few words; Reason says why.
	Summary string
	Reason  string
	// Lineage holds the record's faultrouter.redrive.* headers without the
	// prefix (source.topic, source.partition, source.offset, count).
	Lineage map[string]string
	// Value is the decoded record, as tail prints it.
	Value any
}

// Class and Route of the step's decision, empty without one.
func (s *Step) Class() string {
	if s.Decision == nil {
		return ""
	}
	return string(s.Decision.Class)
}

// Route of the step's decision, empty without one.
func (s *Step) Route() string {
	if s.Decision == nil {
		return ""
	}
	return string(s.Decision.Route)
}

// Filter selects steps; an empty field matches everything. Matching is exact
// except for upper/lower case in class and route.
type Filter struct {
	Task           string
	Class          string
	Route          string
	Rule           string // the decision's rule, e.g. retry.held_expired
	Provider       string
	Model          string
	PromptTemplate string
	// Since and Until bound the record timestamps: Since <= ts < Until; a zero
	// bound is open.
	Since, Until time.Time
}

// Match reports whether s passes every filter.
func (f *Filter) Match(s *Step) bool {
	if !f.Since.IsZero() && s.Timestamp.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && !s.Timestamp.Before(f.Until) {
		return false
	}
	if f.Task != "" && s.TaskID != f.Task {
		return false
	}
	if f.Class != "" && !strings.EqualFold(s.Class(), f.Class) {
		return false
	}
	if f.Route != "" && !strings.EqualFold(s.Route(), f.Route) {
		return false
	}
	if f.Rule != "" && (s.Decision == nil || s.Decision.Rule != f.Rule) {
		return false
	}
	if f.Provider != "" || f.Model != "" || f.PromptTemplate != "" {
		e := s.Event
		if e == nil {
			return false
		}
		if (f.Provider != "" && e.Provider != f.Provider) || (f.Model != "" && e.Model != f.Model) ||
			(f.PromptTemplate != "" && e.PromptTemplate != f.PromptTemplate) {
			return false
		}
	}
	return true
}

// TimelineShorts are the topics of a task's story, in data-path order.
var TimelineShorts = []topicspec.Short{topicspec.Ingress, topicspec.Decisions, topicspec.Audit, topicspec.Retry, topicspec.Review, topicspec.DeadLetter, topicspec.Alerts}

// topicRank orders steps written in the same millisecond along the data
// path: the input first, then what the router wrote for it.
var topicRank = map[topicspec.Short]int{
	topicspec.Ingress: 0, topicspec.Decisions: 1, topicspec.Audit: 2, topicspec.Retry: 3, topicspec.Review: 4, topicspec.DeadLetter: 5, topicspec.Alerts: 6,
}

// Timeline sorts steps in time order; steps of the same millisecond follow
// the data path (input, audit, routed records, alerts), then offsets.
func Timeline(steps []Step) {
	slices.SortStableFunc(steps, func(a, b Step) int {
		if c := a.Timestamp.Compare(b.Timestamp); c != 0 {
			return c
		}
		if c := cmp.Compare(rank(a.Short), rank(b.Short)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Partition, b.Partition); c != 0 {
			return c
		}
		return cmp.Compare(a.Offset, b.Offset)
	})
}

func rank(short topicspec.Short) int {
	if r, ok := topicRank[short]; ok {
		return r
	}
	return len(topicRank)
}

// RedriveCount is the faultrouter.redrive.count a record carries, 0 without
// one.
func RedriveCount(hs []kgo.RecordHeader) int {
	if r := codec.ParseHeaders(hs).Redrive; r != nil {
		return r.Count
	}
	return 0
}

// ErrLoop is returned by Guard for a record re-driven too often.
var ErrLoop = errors.New("replay: refused by the loop guard")

// Guard returns ErrLoop, wrapped with the counts, when a record that was
// re-driven count times may not be re-driven again under max.
func Guard(count, max int) error {
	if count >= max {
		return fmt.Errorf("%w: already re-driven %d times (--max-redrives %d)", ErrLoop, count, max)
	}
	return nil
}

// ErrUnknownOutcome is returned by GuardUnknownOutcome for a write whose
// outcome is unknown, re-driven without --force and --reason.
var ErrUnknownOutcome = errors.New("replay: refused: a write whose outcome is unknown is re-driven only with --force and --reason")

// GuardUnknownOutcome returns ErrUnknownOutcome, wrapped with what makes the
// outcome unknown, when the event ev (decided d, nil if unknown) serves a
// WRITE whose outcome is unknown (state SUBMITTED or UNKNOWN, or a decision
// of class OUTCOME_UNKNOWN) and the operator did not both force the
// re-drive and give a reason. Running such a write again may execute it
// twice (a refund paid twice).
func GuardUnknownOutcome(ev *event.TaskEvent, d *event.Decision, force bool, reason string) error {
	var why string
	switch {
	case d != nil && d.Class == event.ClassOutcomeUnknown:
		why = "its decision is OUTCOME_UNKNOWN"
	case ev != nil && ev.Operation != nil && ev.Operation.Kind == event.OpWrite &&
		(ev.Operation.State == event.OpSubmitted || ev.Operation.State == event.OpUnknown):
		why = fmt.Sprintf("operation %s is a WRITE in state %s", ev.Operation.OpID, ev.Operation.State)
	default:
		return nil
	}
	if force && strings.TrimSpace(reason) != "" {
		return nil
	}
	return fmt.Errorf("%w (%s)", ErrUnknownOutcome, why)
}

// Lineage returns the headers of a re-driven record: the original headers
// minus the router's error and previous lineage headers, then the lineage
// r (the source of the re-drive, the new count, the operator's reason).
func Lineage(orig []kgo.RecordHeader, r codec.Redrive) []kgo.RecordHeader {
	return codec.AppendRedriveHeaders(codec.WithoutContract(orig), &r)
}
