package policy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/task"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/golden from the current code")

// testNow is the router clock of step 0 of every golden case; step i runs at
// testNow + i seconds unless the step sets "now".
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// goldenCase is one file of testdata/cases: a sequence of events and review
// decisions, routed in order the way the router does (exact redeliveries
// through Drop), each with the contract it must meet.
type goldenCase struct {
	// Doc says what the case guards.
	Doc string `json:"doc"`
	// Policy is a YAML policy file applied on top of the defaults.
	Policy string `json:"policy,omitempty"`
	Steps  []step `json:"steps"`
}

type step struct {
	Event  json.RawMessage `json:"event,omitempty"`
	Review json.RawMessage `json:"review,omitempty"`
	// Now overrides the router clock of the step.
	Now *event.Timestamp `json:"now,omitempty"`
	// Expect is the contract of the step's decision, checked independently
	// of the golden file so that -update cannot bless a wrong class.
	Expect expect `json:"expect"`
}

type expect struct {
	Class    event.Class `json:"class"`
	Route    event.Route `json:"route"`
	Rule     string      `json:"rule,omitempty"`
	DelayMs  *int64      `json:"delay_ms,omitempty"`
	Owner    string      `json:"owner,omitempty"`
	Priority string      `json:"priority,omitempty"`
	Retries  *int32      `json:"retries,omitempty"`
}

// goldenStep is one step of a golden file.
type goldenStep struct {
	Input    string         `json:"input"`
	Decision event.Decision `json:"decision"`
}

// TestGolden guards the classes and decisions of docs/design.md and the
// task-state rules: every case of testdata/cases must meet its per-step expectations, and its
// full decisions and final task states must equal testdata/golden (rewrite
// with go test ./pkg/policy -update, then review the diff by reading).
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/cases/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			got := runCase(t, f)
			gf := filepath.Join("testdata", "golden", name+".json")
			if *update {
				if err := os.WriteFile(gf, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(gf)
			if err != nil {
				t.Fatalf("%v (run go test ./pkg/policy -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("decisions differ from %s (go test ./pkg/policy -update rewrites it; review the diff):\n%s", gf, lineDiff(want, got))
			}
		})
	}
}

// runCase routes the case's steps and returns the golden file's content.
func runCase(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var c goldenCase
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if c.Doc == "" || len(c.Steps) == 0 {
		t.Fatalf("%s: a case needs a doc and steps", file)
	}
	p := Default()
	if c.Policy != "" {
		if p, err = Parse([]byte(c.Policy)); err != nil {
			t.Fatalf("%s: policy: %v", file, err)
		}
	}

	states := map[string]*task.State{}
	stateOf := func(id string) *task.State {
		if states[id] == nil {
			states[id] = new(task.State)
		}
		return states[id]
	}
	var out []goldenStep
	for i, s := range c.Steps {
		now := testNow.Add(time.Duration(i) * time.Second)
		if s.Now != nil {
			now = s.Now.Time
		}
		var gs goldenStep
		switch {
		case s.Event != nil:
			ev, err := event.ParseTaskEventJSON(s.Event)
			if err != nil {
				t.Fatalf("step %d: event: %v", i+1, err)
			}
			st := stateOf(ev.TaskID)
			if st.Seen(ev.EventID) {
				gs = goldenStep{"redelivery of event " + ev.EventID, p.Drop(&ev, st, now)}
			} else {
				gs = goldenStep{"event " + ev.EventID + " (task " + ev.TaskID + ")", p.Decide(&ev, st, now)}
			}
		case s.Review != nil:
			rd, err := event.ParseReviewDecisionJSON(s.Review)
			if err != nil {
				t.Fatalf("step %d: review: %v", i+1, err)
			}
			verb := "reject"
			if rd.Approve {
				verb = "approve"
			}
			// The store hands an unknown task to the policy as an empty state.
			st := states[rd.TaskID]
			if st == nil {
				st = new(task.State)
			}
			gs = goldenStep{"review " + verb + " (task " + rd.TaskID + ")", p.DecideReview(&rd, st, now)}
		default:
			t.Fatalf("step %d: needs an event or a review", i+1)
		}
		checkExpect(t, i+1, gs.Decision, s.Expect)
		out = append(out, gs)
	}

	ids := make([]string, 0, len(states))
	for id := range states {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	final := make([]json.RawMessage, 0, len(ids))
	for _, id := range ids {
		final = append(final, stateSummary(t, states[id]))
	}
	g, err := json.MarshalIndent(struct {
		Doc    string            `json:"doc"`
		Steps  []goldenStep      `json:"steps"`
		States []json.RawMessage `json:"final_states"`
	}{c.Doc, out, final}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(g, '\n')
}

func checkExpect(t *testing.T, n int, d event.Decision, e expect) {
	t.Helper()
	if e.Class == "" || e.Route == "" {
		t.Fatalf("step %d: expect needs class and route", n)
	}
	bad := func(what string, got, want any) {
		t.Errorf("step %d: %s = %v, want %v (reason: %s)", n, what, got, want, d.Reason)
	}
	if d.Class != e.Class {
		bad("class", d.Class, e.Class)
	}
	if d.Route != e.Route {
		bad("route", d.Route, e.Route)
	}
	if e.Rule != "" && d.Rule != e.Rule {
		bad("rule", d.Rule, e.Rule)
	}
	if (d.Route == event.RouteRetry) != (d.Retry != nil) {
		t.Errorf("step %d: route %s with retry plan %v", n, d.Route, d.Retry)
	}
	isReview := d.Route == event.RouteReview || d.Route == event.RouteQuarantine
	if isReview != (d.Review != nil) {
		t.Errorf("step %d: route %s with review %v", n, d.Route, d.Review)
	}
	if e.DelayMs != nil && (d.Retry == nil || d.Retry.DelayMs != *e.DelayMs) {
		bad("retry", d.Retry, fmt.Sprintf("delay_ms %d", *e.DelayMs))
	}
	if e.Owner != "" && (d.Review == nil || d.Review.Owner != e.Owner) {
		bad("review", d.Review, "owner "+e.Owner)
	}
	if e.Priority != "" && (d.Review == nil || d.Review.Priority != e.Priority) {
		bad("review", d.Review, "priority "+e.Priority)
	}
	if e.Retries != nil && d.Totals.Retries != *e.Retries {
		bad("totals.retries", d.Totals.Retries, *e.Retries)
	}
}

// stateSummary is the task state of a golden file with the last event
// reduced to its ID.
func stateSummary(t *testing.T, st *task.State) json.RawMessage {
	t.Helper()
	b, err := st.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "last_event")
	if st.LastEvent != nil {
		m["last_event_id"] = st.LastEvent.EventID
	}
	b, err = json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lineDiff shows the first differing lines of two texts.
func lineDiff(want, got []byte) string {
	w, g := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			return fmt.Sprintf("line %d:\n  want %s\n  got  %s", i+1, wl, gl)
		}
	}
	return "(no line differs)"
}
