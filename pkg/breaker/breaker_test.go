package breaker

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testConfig() Config {
	return Config{Window: 10 * time.Second, MinRequests: 4, FailureRatio: 0.5, Cooldown: 5 * time.Second, HalfOpenProbes: 1}
}

func newTestSet(t *testing.T) *Set {
	t.Helper()
	s, err := NewSet(testConfig(), testConfig(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var pm = Ref{Scope: ProviderModel, Key: "acme/m1"}

// step is one call on a Set: an outcome at offset ms (fail/ok), an Allow,
// or a Tick; want is the transitions it must return, as "FROM>TO".
type step struct {
	at    int64
	op    string // fail, ok, allow, deny, tick
	wants []string
}

// TestRollingWindow guards the breaker state machine: opening needs
// min_requests outcomes within the window and a failure ratio >= the
// threshold; OPEN refuses retries until the cooldown; HALF_OPEN lets
// half_open_probes retries through; a success closes it, a failure re-opens.
func TestRollingWindow(t *testing.T) {
	tests := []struct {
		name  string
		steps []step
	}{
		{"below min requests stays closed", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "allow", nil},
		}},
		{"min requests at ratio opens", []step{
			{0, "ok", nil}, {1, "ok", nil}, {2, "fail", nil}, {3, "fail", []string{"CLOSED>OPEN"}}, {4, "deny", nil},
		}},
		{"ratio below threshold stays closed", []step{
			{0, "ok", nil}, {1, "ok", nil}, {2, "ok", nil}, {3, "fail", nil}, {4, "fail", nil}, {5, "allow", nil},
		}},
		{"a success never opens", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "ok", nil}, {4, "allow", nil},
		}},
		{"failures outside the window do not count", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {11_000, "fail", nil}, {11_001, "allow", nil},
		}},
		{"cooldown half-opens, one probe, success closes", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "fail", []string{"CLOSED>OPEN"}},
			{5_002, "deny", nil},
			{5_003, "allow", []string{"OPEN>HALF_OPEN"}}, // the probe
			{5_004, "deny", nil},                         // one probe only
			{5_005, "ok", []string{"HALF_OPEN>CLOSED"}},
			{5_006, "allow", nil}, {5_007, "allow", nil},
		}},
		{"tick half-opens without traffic", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "fail", []string{"CLOSED>OPEN"}},
			{5_002, "tick", nil}, {5_003, "tick", []string{"OPEN>HALF_OPEN"}}, {5_004, "tick", nil},
		}},
		{"failure while half-open re-opens with a new cooldown", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "fail", []string{"CLOSED>OPEN"}},
			{5_003, "allow", []string{"OPEN>HALF_OPEN"}},
			{5_010, "fail", []string{"HALF_OPEN>OPEN"}},
			{10_009, "deny", nil},
			{10_010, "allow", []string{"OPEN>HALF_OPEN"}},
		}},
		{"outcome after cooldown half-opens then applies", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "fail", []string{"CLOSED>OPEN"}},
			{6_000, "ok", []string{"OPEN>HALF_OPEN", "HALF_OPEN>CLOSED"}},
		}},
		{"closing clears the window", []step{
			{0, "fail", nil}, {1, "fail", nil}, {2, "fail", nil}, {3, "fail", []string{"CLOSED>OPEN"}},
			{6_000, "ok", []string{"OPEN>HALF_OPEN", "HALF_OPEN>CLOSED"}},
			{6_001, "fail", nil}, {6_002, "fail", nil}, {6_003, "allow", nil},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSet(t)
			for i, st := range tt.steps {
				now := t0.Add(time.Duration(st.at) * time.Millisecond)
				var got []Transition
				switch st.op {
				case "fail", "ok":
					got = s.Record(Outcome{Ref: pm, Failure: st.op == "fail", TaskID: "t"}, now)
				case "allow", "deny":
					var ok bool
					ok, got = s.Allow([]Ref{pm}, now)
					if ok != (st.op == "allow") {
						t.Fatalf("step %d (%s at %d): Allow = %v", i, st.op, st.at, ok)
					}
				case "tick":
					got = s.Tick(now)
				}
				var names []string
				for _, tr := range got {
					names = append(names, tr.From.String()+">"+tr.To.String())
					if tr.Ref != pm || !tr.At.Equal(now) {
						t.Errorf("step %d: transition %+v: wrong ref or time", i, tr)
					}
				}
				if strings.Join(names, ",") != strings.Join(st.wants, ",") {
					t.Fatalf("step %d (%s at %d): transitions %v, want %v", i, st.op, st.at, names, st.wants)
				}
			}
		})
	}
}

// TestTransitionCarriesCounts guards the BreakerEvent fields: the opening
// transition names the window counts and the triggering task and class.
func TestTransitionCarriesCounts(t *testing.T) {
	s := newTestSet(t)
	var got []Transition
	for i, fail := range []bool{true, false, true, true} {
		got = s.Record(Outcome{Ref: pm, Failure: fail, Class: "RATE_LIMITED", TaskID: "task-" + string(rune('a'+i))}, t0)
	}
	if len(got) != 1 {
		t.Fatalf("transitions = %+v", got)
	}
	tr := got[0]
	if tr.Failures != 3 || tr.Requests != 4 || tr.TaskID != "task-d" || tr.Class != "RATE_LIMITED" || tr.Reason == "" {
		t.Errorf("transition = %+v", tr)
	}
}

// TestTripLatchesUntilReset guards the hallucination rule: a tripped
// breaker stays OPEN past any cooldown until a person resets it.
func TestTripLatchesUntilReset(t *testing.T) {
	s := newTestSet(t)
	tpl := Ref{Scope: PromptTemplate, Key: "refund-v3"}
	ts := s.Trip(tpl, "hallucination", Outcome{TaskID: "t1", Class: "MODEL_HALLUCINATION"}, t0)
	if len(ts) != 1 || ts[0].To != Open || ts[0].TaskID != "t1" {
		t.Fatalf("Trip = %+v", ts)
	}
	if again := s.Trip(tpl, "hallucination", Outcome{}, t0); len(again) != 0 {
		t.Errorf("second Trip = %+v, want none", again)
	}
	later := t0.Add(time.Hour)
	if ok, ts := s.Allow([]Ref{tpl}, later); ok || len(ts) != 0 {
		t.Errorf("Allow after an hour = %v %+v, want refused, no transition", ok, ts)
	}
	if ts := s.Record(Outcome{Ref: tpl}, later); len(ts) != 0 || s.State(tpl) != Open {
		t.Errorf("a success closed a latched breaker: %+v", ts)
	}
	ts = s.Reset(tpl, "reset by on-call", later)
	if len(ts) != 1 || ts[0].From != Open || ts[0].To != Closed {
		t.Fatalf("Reset = %+v", ts)
	}
	if ok, _ := s.Allow([]Ref{tpl}, later); !ok {
		t.Error("Allow after Reset refused")
	}
}

// TestAllowUsesProbesOnlyWhenAllAllow guards multi-scope holds: a retry
// refused by one open breaker does not use up another's half-open probe.
func TestAllowUsesProbesOnlyWhenAllAllow(t *testing.T) {
	s := newTestSet(t)
	ds := Ref{Scope: Downstream, Key: "refund"}
	for i := range 4 {
		s.Record(Outcome{Ref: pm, Failure: true}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	s.Trip(ds, "test", Outcome{}, t0.Add(time.Minute))
	at := t0.Add(time.Minute)
	if ok, _ := s.Allow([]Ref{pm, ds}, at); ok {
		t.Fatal("allowed through an open downstream breaker")
	}
	s.Reset(ds, "test", at)
	if ok, _ := s.Allow([]Ref{pm, ds}, at); !ok {
		t.Fatal("the half-open probe was used up by a refused retry")
	}
}

// TestCounts guards the state gauge's source: breakers per scope and state.
func TestCounts(t *testing.T) {
	s := newTestSet(t)
	for i := range 4 {
		s.Record(Outcome{Ref: pm, Failure: true}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	s.Record(Outcome{Ref: Ref{Scope: Downstream, Key: "refund"}}, t0)
	c := s.Counts()
	if c[ProviderModel][Open] != 1 || c[Downstream][Closed] != 1 || c[PromptTemplate][Closed] != 0 {
		t.Errorf("Counts = %v", c)
	}
}

// TestConfigValidate guards the field-named errors of a bad Config.
func TestConfigValidate(t *testing.T) {
	tests := []struct {
		field string
		mod   func(*Config)
	}{
		{"Window", func(c *Config) { c.Window = 0 }},
		{"MinRequests", func(c *Config) { c.MinRequests = 0 }},
		{"FailureRatio", func(c *Config) { c.FailureRatio = 1.5 }},
		{"FailureRatio", func(c *Config) { c.FailureRatio = 0 }},
		{"Cooldown", func(c *Config) { c.Cooldown = -1 }},
		{"HalfOpenProbes", func(c *Config) { c.HalfOpenProbes = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			c := testConfig()
			tt.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.field+":") {
				t.Errorf("Validate() = %v, want an error naming %s", err, tt.field)
			}
		})
	}
	if err := testConfig().Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// TestStringsCoverEveryValue guards the typed enums' names: each has one,
// and each name parses back to its value (the breakers topic and the alerts
// carry them as text).
func TestStringsCoverEveryValue(t *testing.T) {
	for _, s := range States {
		if strings.HasPrefix(s.String(), "State(") {
			t.Errorf("state %d has no name", s)
		}
		if got, ok := ParseState(s.Name()); !ok || got != s {
			t.Errorf("ParseState(%s) = %v, %v", s, got, ok)
		}
	}
	if _, ok := ParseState("NOPE"); ok {
		t.Error("ParseState accepted NOPE")
	}
	for _, sc := range Scopes {
		got, err := ParseScope(sc.Name())
		if err != nil || got != sc {
			t.Errorf("ParseScope(%s) = %v, %v", sc, got, err)
		}
	}
	if _, err := ParseScope("NOPE"); err == nil {
		t.Error("ParseScope accepted NOPE")
	}
}

// TestHoldUntil guards when a held retry is looked at again: the end of the
// cooldown while OPEN, a recheck while HALF_OPEN with its probe out, never
// before now.
func TestHoldUntil(t *testing.T) {
	s := newTestSet(t)
	for range 4 {
		s.Record(Outcome{Ref: pm, Failure: true}, t0)
	}
	if got := s.HoldUntil([]Ref{pm}, t0.Add(time.Second)); !got.Equal(t0.Add(5 * time.Second)) {
		t.Errorf("OPEN: HoldUntil = %v, want the cooldown's end %v", got, t0.Add(5*time.Second))
	}
	at := t0.Add(5 * time.Second)
	if ok, _ := s.Allow([]Ref{pm}, at); !ok {
		t.Fatal("no probe after the cooldown")
	}
	if got := s.HoldUntil([]Ref{pm}, at); !got.Equal(at.Add(1250 * time.Millisecond)) {
		t.Errorf("HALF_OPEN: HoldUntil = %v, want a recheck a quarter cooldown later", got)
	}
	// a retry refused later waits for the same recheck, and one refused at
	// the recheck for the next one
	if got := s.HoldUntil([]Ref{pm}, at.Add(700*time.Millisecond)); !got.Equal(at.Add(1250 * time.Millisecond)) {
		t.Errorf("HALF_OPEN, 700 ms on: HoldUntil = %v, want the same recheck %v", got, at.Add(1250*time.Millisecond))
	}
	if got := s.HoldUntil([]Ref{pm}, at.Add(1250*time.Millisecond)); !got.Equal(at.Add(2500 * time.Millisecond)) {
		t.Errorf("HALF_OPEN, at the recheck: HoldUntil = %v, want the next one %v", got, at.Add(2500*time.Millisecond))
	}
	// latched: rechecks every quarter cooldown from the latch
	tmpl := Ref{Scope: PromptTemplate, Key: "tpl"}
	s.Trip(tmpl, "hallucination", Outcome{}, t0)
	if got := s.HoldUntil([]Ref{tmpl}, t0.Add(1300*time.Millisecond)); !got.Equal(t0.Add(2500 * time.Millisecond)) {
		t.Errorf("latched: HoldUntil = %v, want the second recheck after the latch %v", got, t0.Add(2500*time.Millisecond))
	}
	other := Ref{Scope: Downstream, Key: "unknown"}
	if got := s.HoldUntil([]Ref{other}, at); !got.Equal(at) {
		t.Errorf("unknown breaker: HoldUntil = %v, want now", got)
	}
}

// TestMaxBreakersBoundsMemory guards the key bound: a flood of distinct keys
// forgets idle CLOSED breakers first and never an OPEN one.
func TestMaxBreakersBoundsMemory(t *testing.T) {
	defer func(n int) { MaxBreakers = n }(MaxBreakers)
	MaxBreakers = 8
	s := newTestSet(t)
	for range 4 {
		s.Record(Outcome{Ref: pm, Failure: true}, t0)
	}
	late := t0.Add(time.Hour) // every window but the new ones' is empty by now
	for i := range 50 {
		s.Record(Outcome{Ref: Ref{Scope: Downstream, Key: fmt.Sprint("k", i)}}, late)
		if s.breakers.Len() > MaxBreakers {
			t.Fatalf("after %d keys: %d breakers, bound %d", i+1, s.breakers.Len(), MaxBreakers)
		}
	}
	if s.State(pm) != Open {
		t.Error("the OPEN breaker was forgotten")
	}
}

// Guards the unit of changes a router wraps around one batch: Rollback
// leaves every breaker as it was at Begin (a counted outcome, a latch, a
// half-open probe slot, a breaker first seen), Commit keeps the changes.
func TestSetRollback(t *testing.T) {
	cfg := Config{Window: time.Minute, MinRequests: 2, FailureRatio: 0.5, Cooldown: time.Second, HalfOpenProbes: 1}
	s, err := NewSet(cfg, cfg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	pm := Ref{Scope: ProviderModel, Key: "acme/m1"}
	tpl := Ref{Scope: PromptTemplate, Key: "tpl"}
	s.Record(Outcome{Ref: pm, Failure: true}, now)
	s.Record(Outcome{Ref: pm, Failure: true}, now) // OPEN
	later := now.Add(2 * time.Second)

	s.Begin()
	if ok, ts := s.Allow([]Ref{pm}, later); !ok || len(ts) != 1 || ts[0].To != HalfOpen {
		t.Fatalf("Allow after the cooldown = %v %v, want the probe and OPEN->HALF_OPEN", ok, ts)
	}
	if ts := s.Trip(tpl, "latched", Outcome{}, later); len(ts) != 1 {
		t.Fatalf("Trip = %v", ts)
	}
	s.Rollback()
	if s.State(pm) != Open || s.State(tpl) != Closed {
		t.Fatalf("after Rollback: %s %s, want OPEN and CLOSED", s.State(pm), s.State(tpl))
	}
	// the probe slot and the latch were given back: the batch again half-opens
	// it, releases one probe and latches the template
	s.Begin()
	if ok, ts := s.Allow([]Ref{pm}, later); !ok || len(ts) != 1 {
		t.Fatalf("Allow after Rollback = %v %v, want the probe and the transition again", ok, ts)
	}
	if ts := s.Trip(tpl, "latched", Outcome{}, later); len(ts) != 1 {
		t.Fatalf("Trip after Rollback = %v, want CLOSED->OPEN again", ts)
	}
	s.Commit()
	if ok, _ := s.Allow([]Ref{pm}, later); ok {
		t.Error("a second probe was allowed after Commit")
	}
	if s.State(tpl) != Open {
		t.Errorf("template %s after Commit, want OPEN", s.State(tpl))
	}
}

// Guards the surge detector's unit of changes: a surge fired in a rolled
// back batch fires again when the batch is processed again.
func TestSurgesRollback(t *testing.T) {
	s, err := NewSurges(SurgeConfig{Window: time.Minute, MinEvents: 1, Ratio: 0.5, Classes: []string{"MODEL_REFUSAL"}, Scopes: []Scope{PromptTemplate}})
	if err != nil {
		t.Fatal(err)
	}
	ref := Ref{Scope: PromptTemplate, Key: "tpl"}
	now := time.Unix(1000, 0)
	s.Begin()
	if _, fired := s.Record(ref, "MODEL_REFUSAL", "t1", now); !fired {
		t.Fatal("no surge")
	}
	s.Rollback()
	s.Begin()
	if _, fired := s.Record(ref, "MODEL_REFUSAL", "t1", now); !fired {
		t.Fatal("the surge of a rolled back batch did not fire again")
	}
	s.Commit()
	if _, fired := s.Record(ref, "MODEL_REFUSAL", "t2", now); fired {
		t.Error("a committed surge fired twice")
	}
}

// Guards Rollback after a breaker and a surge key were changed several times
// in one unit, one of them first seen in it: each is left as it was at Begin
// (the new one forgotten), not as it was after its first change.
func TestRollbackAfterRepeatedChanges(t *testing.T) {
	cfg := Config{Window: time.Minute, MinRequests: 2, FailureRatio: 0.6, Cooldown: time.Second, HalfOpenProbes: 1}
	s, err := NewSet(cfg, cfg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	old := Ref{Scope: ProviderModel, Key: "acme/m1"}
	fresh := Ref{Scope: PromptTemplate, Key: "tpl"}
	s.Begin()
	s.Record(Outcome{Ref: old, Failure: false}, now)
	s.Commit()
	s.Begin()
	for range 2 {
		s.Record(Outcome{Ref: old, Failure: true}, now)
		s.Record(Outcome{Ref: fresh, Failure: true}, now)
	}
	s.Rollback()
	// at Begin: old had one success, fresh did not exist; one failure each
	// now opens neither (1 of 2 is under the ratio, 1 of 1 under MinRequests)
	s.Begin()
	for _, ref := range []Ref{old, fresh} {
		if ts := s.Record(Outcome{Ref: ref, Failure: true}, now); len(ts) != 0 || s.State(ref) != Closed {
			t.Errorf("%v after Rollback and one failure: %s %v, want CLOSED", ref, s.State(ref), ts)
		}
	}
	s.Commit()

	sg, err := NewSurges(SurgeConfig{Window: time.Minute, MinEvents: 2, Ratio: 0.5, Classes: []string{"MODEL_REFUSAL"}, Scopes: []Scope{PromptTemplate}})
	if err != nil {
		t.Fatal(err)
	}
	sg.Begin()
	sg.Record(fresh, "MODEL_REFUSAL", "t1", now)
	if _, fired := sg.Record(fresh, "MODEL_REFUSAL", "t2", now); !fired {
		t.Fatal("no surge")
	}
	sg.Rollback()
	sg.Begin()
	if _, fired := sg.Record(fresh, "MODEL_REFUSAL", "t1", now); fired {
		t.Error("one event after Rollback fired a surge: the key kept an event of the rolled back unit")
	}
	if _, fired := sg.Record(fresh, "MODEL_REFUSAL", "t2", now); !fired {
		t.Error("the surge of a rolled back unit did not fire again")
	}
}

// Guards the bound of a Set over months of distinct keys: at MaxBreakers,
// CLOSED breakers are forgotten, OPEN and latched ones never are, and when
// the set is full of those, a new key is counted under its scope's overflow
// breaker, which opens on the failures of the keys beyond the bound and
// holds their retries (Allow, State, HoldUntil, Resolve), whatever their own
// keys. The set never holds more than MaxBreakers plus one overflow breaker
// per scope.
func TestSetIsBoundedWithAnOverflowBreaker(t *testing.T) {
	defer func(n int) { MaxBreakers = n }(MaxBreakers)
	MaxBreakers = 50
	cfg := Config{Window: time.Minute, MinRequests: 2, FailureRatio: 0.5, Cooldown: time.Hour, HalfOpenProbes: 1}
	s, err := NewSet(cfg, cfg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	tmpl := func(i int) Ref { return Ref{Scope: PromptTemplate, Key: fmt.Sprintf("t-%d", i)} }
	// 50 templates latched open by hallucinations: none may be forgotten
	for i := range 50 {
		s.Trip(tmpl(i), "hallucination", Outcome{Ref: tmpl(i)}, now)
	}
	// a flood of new keys failing: counted under the overflow breaker
	var opened []Transition
	for i := 50; i < 5_000; i++ {
		for range 2 {
			for _, tr := range s.Record(Outcome{Ref: tmpl(i), Failure: true}, now) {
				if tr.To == Open {
					opened = append(opened, tr)
				}
			}
		}
	}
	if n := s.breakers.Len(); n > MaxBreakers+len(Scopes) {
		t.Fatalf("%d breakers after 5,000 keys, want at most %d", n, MaxBreakers+len(Scopes))
	}
	for i := range 50 {
		if !s.Latched(tmpl(i)) {
			t.Fatalf("latched template %s was forgotten", tmpl(i).Key)
		}
	}
	overflow := Ref{Scope: PromptTemplate, Key: OverflowKey}
	if len(opened) != 1 || opened[0].Ref != overflow {
		t.Fatalf("transitions to OPEN %v, want one, of %v", opened, overflow)
	}
	late := tmpl(4_999)
	if s.State(late) != Open {
		t.Errorf("a key beyond the bound: state %s, want its overflow breaker's OPEN", s.State(late))
	}
	if ok, _ := s.Allow([]Ref{late}, now); ok {
		t.Errorf("a retry of a key beyond the bound was allowed while its overflow breaker is open")
	}
	if got := s.Resolve([]Ref{{Scope: ProviderModel, Key: "acme/m1"}, late}); got[1] != overflow {
		t.Errorf("Resolve = %v, want the template held behind %v", got, overflow)
	}
	if !s.HoldUntil([]Ref{late}, now).After(now) {
		t.Errorf("HoldUntil of a key beyond the bound is now, want the overflow breaker's cooldown")
	}
}

// Guards Adopt, the breaker side of sharing breakers between instances: an
// adopted OPEN keeps the time it opened on its writer (its cooldown ends
// there, not a cooldown after the adoption) and keeps the instance's own
// window; the writer probes alone for a cooldown (N instances do not send
// N times the probes); an adopted latch is not half-opened by the cooldown; an adopted
// CLOSED clears the latch; a CLOSED state of a breaker never seen creates
// none; and a unit of changes that rolls back undoes an adoption.
func TestAdopt(t *testing.T) {
	cfg := Config{Window: time.Minute, MinRequests: 2, FailureRatio: 0.5, Cooldown: 30 * time.Second, HalfOpenProbes: 1}
	s, err := NewSet(cfg, cfg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	pm := Ref{Scope: ProviderModel, Key: "acme/m1"}
	if ts := s.Adopt(pm, Shared{State: Closed}, "adopted", t0); len(ts) != 0 || s.breakers.Len() != 0 {
		t.Fatalf("adopting CLOSED for a breaker never seen: %v, %d breakers; want nothing", ts, s.breakers.Len())
	}
	ts := s.Adopt(pm, Shared{State: Open, OpenedAt: t0.Add(-20 * time.Second), Elsewhere: true}, "adopted from a: failing", t0)
	if len(ts) != 1 || ts[0].From != Closed || ts[0].To != Open || ts[0].Reason != "adopted from a: failing" {
		t.Fatalf("adopting OPEN: %+v, want one CLOSED -> OPEN", ts)
	}
	if got := s.Shared(pm); got.State != Open || !got.OpenedAt.Equal(t0.Add(-20*time.Second)) {
		t.Fatalf("Shared after adopting OPEN: %+v", got)
	}
	// the writer half-opens at t0+10s and probes alone for a recheck step
	// (7.5 s)
	if ok, ts := s.Allow([]Ref{pm}, t0.Add(17*time.Second)); ok || len(ts) != 0 {
		t.Fatalf("a recheck step after the writer's cooldown end: allowed %v, %v; want held, the writer probing alone", ok, ts)
	}
	if got := s.HoldUntil([]Ref{pm}, t0); !got.Equal(t0.Add(17500 * time.Millisecond)) {
		t.Fatalf("a retry behind the adopted OPEN is asked again at %s, want t0+17.5s", got)
	}
	if ok, ts := s.Allow([]Ref{pm}, t0.Add(17500*time.Millisecond)); !ok || len(ts) != 1 || ts[0].To != HalfOpen {
		t.Fatalf("the writer gone: allowed %v, %v; want this instance's own probe through HALF_OPEN", ok, ts)
	}
	// an adopted HALF_OPEN lets no probe through for a cooldown
	dm := Ref{Scope: Downstream, Key: "refund"}
	if ts := s.Adopt(dm, Shared{State: HalfOpen, Elsewhere: true}, "adopted from a: cooldown over", t0); len(ts) != 1 || ts[0].To != HalfOpen {
		t.Fatalf("adopting HALF_OPEN: %v", ts)
	}
	if ok, _ := s.Allow([]Ref{dm}, t0.Add(29*time.Second)); ok {
		t.Fatal("an adopted HALF_OPEN let a probe through while its writer probes")
	}
	if ok, _ := s.Allow([]Ref{dm}, t0.Add(30*time.Second)); !ok {
		t.Fatal("an adopted HALF_OPEN let no probe through a cooldown after it was adopted")
	}
	// its own state, restored after a restart, half-opens at its own cooldown end
	own := Ref{Scope: ProviderModel, Key: "acme/m2"}
	s.Adopt(own, Shared{State: Open, OpenedAt: t0}, "adopted from b: failing", t0.Add(time.Second))
	if ok, ts := s.Allow([]Ref{own}, t0.Add(30*time.Second)); !ok || len(ts) != 1 || ts[0].To != HalfOpen {
		t.Fatalf("its own restored OPEN at its cooldown end: allowed %v, %v; want a probe through HALF_OPEN", ok, ts)
	}

	tpl := Ref{Scope: PromptTemplate, Key: "refund-v9"}
	s.Begin()
	s.Adopt(tpl, Shared{State: Open, Latched: true, OpenedAt: t0}, "adopted from a: latched", t0)
	s.Rollback()
	if s.State(tpl) != Closed {
		t.Fatal("Rollback did not undo an adoption")
	}
	s.Adopt(tpl, Shared{State: Open, Latched: true, OpenedAt: t0}, "adopted from a: latched", t0)
	if ts := s.Tick(t0.Add(time.Hour)); len(ts) != 0 || !s.Latched(tpl) {
		t.Fatalf("an adopted latch half-opened on the cooldown: %v", ts)
	}
	if ts := s.Adopt(tpl, Shared{State: Closed}, "adopted from a: reset", t0.Add(time.Hour)); len(ts) != 1 || s.Latched(tpl) || s.State(tpl) != Closed {
		t.Fatalf("adopting CLOSED left the latch: %v", ts)
	}
}

// Guards the cooldown an instance began: a breaker already OPEN here that
// adopts another instance's OPEN with an earlier opening time keeps its own
// (later) one, so it does not half-open before its own cooldown ends.
func TestAdoptOpenKeepsTheLaterOpening(t *testing.T) {
	cfg := Config{Window: time.Minute, MinRequests: 2, FailureRatio: 0.5, Cooldown: 30 * time.Second, HalfOpenProbes: 1}
	s, err := NewSet(cfg, cfg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := Ref{Scope: ProviderModel, Key: "acme/m1"}
	t0 := time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC)
	s.Record(Outcome{Ref: ref, Failure: true}, t0)
	s.Record(Outcome{Ref: ref, Failure: true}, t0)
	if s.State(ref) != Open {
		t.Fatalf("state %s, want OPEN", s.State(ref))
	}
	s.Adopt(ref, Shared{State: Open, OpenedAt: t0.Add(-25 * time.Second), Elsewhere: true}, "adopted", t0.Add(time.Second))
	if ok, _ := s.Allow([]Ref{ref}, t0.Add(29*time.Second)); ok || s.State(ref) != Open {
		t.Fatalf("29 s after it opened here the breaker is %s (allowed %v), want OPEN: its own cooldown is 30 s", s.State(ref), ok)
	}
}

// TestUnlatchLeavesTheSharedState guards the end of a latch by its last
// item: the breaker takes the failure-rate state shared for it. A shared
// OPEN keeps refusing until its own cooldown (and, written elsewhere, a
// recheck step more) ends, its transition OPEN to OPEN; a shared CLOSED closes it;
// a rollback brings the latch back.
func TestUnlatchLeavesTheSharedState(t *testing.T) {
	tpl := Ref{Scope: PromptTemplate, Key: "refund-v3"}
	s := newTestSet(t)
	s.Trip(tpl, "hallucination", Outcome{TaskID: "t1"}, t0)
	opened := t0.Add(2 * time.Second) // another instance's OPEN, cooldown 5 s
	now := t0.Add(3 * time.Second)
	s.Begin()
	if ts := s.Unlatch(tpl, Shared{State: Open, OpenedAt: opened, Elsewhere: true}, "item decided", now); len(ts) != 1 || ts[0].From != Open || ts[0].To != Open {
		t.Fatalf("Unlatch into a shared OPEN = %+v, want one OPEN>OPEN transition (the latch alone ended)", ts)
	}
	if s.Latched(tpl) || s.State(tpl) != Open {
		t.Fatalf("after Unlatch: latched %v, state %s; want unlatched OPEN", s.Latched(tpl), s.State(tpl))
	}
	if ok, _ := s.Allow([]Ref{tpl}, opened.Add(4*time.Second)); ok {
		t.Error("a retry was let through inside the shared OPEN's cooldown")
	}
	if got, want := s.HoldUntil([]Ref{tpl}, now), opened.Add(5*time.Second+time.Second+250*time.Millisecond); !got.Equal(want) {
		t.Errorf("HoldUntil = %s, want the shared cooldown's end and a recheck step, %s", got, want)
	}
	s.Rollback()
	if !s.Latched(tpl) {
		t.Error("a rolled-back Unlatch left the breaker unlatched")
	}
	if ts := s.Unlatch(tpl, Shared{}, "item decided", now); len(ts) != 1 || ts[0].To != Closed {
		t.Fatalf("Unlatch into a shared CLOSED = %+v, want OPEN>CLOSED", ts)
	}
	if ok, _ := s.Allow([]Ref{tpl}, now); !ok {
		t.Error("a retry was refused after the latch ended into CLOSED")
	}
	if ts := s.Unlatch(tpl, Shared{}, "again", now); ts != nil {
		t.Errorf("Unlatch of a breaker not latched = %+v, want nothing", ts)
	}
}

// TestTripOfAnOpenBreakerSaysItLatched guards the alerts of a latch that
// begins on a breaker its failure rate opened: the transition is OPEN to
// OPEN, with the outcome's task, so that a reader of the transitions knows
// it is latched (and, when the latch ends, Unlatch's OPEN to OPEN).
func TestTripOfAnOpenBreakerSaysItLatched(t *testing.T) {
	s := newTestSet(t)
	for i := range 4 {
		s.Record(Outcome{Ref: pm, Failure: true}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if s.State(pm) != Open {
		t.Fatalf("four failures left the breaker %s", s.State(pm))
	}
	ts := s.Trip(pm, "hallucination", Outcome{TaskID: "t9", Class: "MODEL_HALLUCINATION"}, t0.Add(time.Second))
	if len(ts) != 1 || ts[0].From != Open || ts[0].To != Open || ts[0].TaskID != "t9" || !s.Latched(pm) {
		t.Fatalf("Trip of an OPEN breaker = %+v (latched %v), want one OPEN>OPEN transition of t9", ts, s.Latched(pm))
	}
}

// TestSetLimitsPerKey guards SetLimits: a key with limits of its own opens,
// cools down and expires on them; the other keys of its scope keep the
// scope's; the overflow breaker keeps the scope's.
func TestSetLimitsPerKey(t *testing.T) {
	s := newTestSet(t)
	own := Config{Window: 10 * time.Second, MinRequests: 2, FailureRatio: 0.5, Cooldown: 30 * time.Second, HalfOpenProbes: 1}
	s.SetLimits(func(r Ref) *Config {
		if r == pm {
			return &own
		}
		return nil
	})
	other := Ref{Scope: ProviderModel, Key: "acme/m2"}
	for i := range 2 {
		at := t0.Add(time.Duration(i) * time.Millisecond)
		s.Record(Outcome{Ref: pm, Failure: true}, at)
		s.Record(Outcome{Ref: other, Failure: true}, at)
	}
	if s.State(pm) != Open || s.State(other) != Closed {
		t.Fatalf("after 2 failures each: %s %s, %s %s; want acme/m1 OPEN (min_requests 2), acme/m2 CLOSED (4)", pm, s.State(pm), other, s.State(other))
	}
	// the scope's cooldown is 5 s; acme/m1's own is 30 s
	if ok, _ := s.Allow([]Ref{pm}, t0.Add(6*time.Second)); ok || s.State(pm) != Open {
		t.Fatalf("acme/m1 let a retry through 6 s after opening (state %s), its cooldown is 30 s", s.State(pm))
	}
	if ok, _ := s.Allow([]Ref{pm}, t0.Add(31*time.Second)); !ok || s.State(pm) != HalfOpen {
		t.Fatalf("acme/m1 held a retry 31 s after opening (state %s), its cooldown is 30 s", s.State(pm))
	}
	if got, want := s.IdleOf(pm), idle(&own); got != want || got == s.Idle(ProviderModel) {
		t.Errorf("IdleOf(acme/m1) %s, want %s (not the scope's %s)", got, want, s.Idle(ProviderModel))
	}
	if s.config(Ref{Scope: ProviderModel, Key: OverflowKey}) != &s.cfg[ProviderModel] {
		t.Error("the overflow breaker does not keep its scope's limits")
	}
}

// Guards a half-open breaker whose probes never report: the worker that
// took a probe died, or never reports its outcome. A cooldown after the
// last probe went out, with not every outcome in, the breaker half-opens
// again and lets as many new probes through; until then it refuses. An
// outcome of an earlier probe that comes later still counts (a success
// closes it), and a batch rolled back gives the new round back.
func TestUnansweredProbesAreReplacedAfterACooldown(t *testing.T) {
	cfg := Config{Window: time.Minute, MinRequests: 2, FailureRatio: 0.5, Cooldown: 10 * time.Second, HalfOpenProbes: 2}
	s, err := NewSet(cfg, cfg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	pm := Ref{Scope: ProviderModel, Key: "acme/m1"}
	s.Record(Outcome{Ref: pm, Failure: true}, t0)
	s.Record(Outcome{Ref: pm, Failure: true}, t0) // OPEN
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	allow := func(d time.Duration) (bool, []Transition) { return s.Allow([]Ref{pm}, at(d)) }

	if ok, ts := allow(10 * time.Second); !ok || len(ts) != 1 || ts[0].To != HalfOpen {
		t.Fatalf("Allow at the cooldown's end = %v %v, want the first probe and OPEN->HALF_OPEN", ok, ts)
	}
	if ok, ts := allow(12 * time.Second); !ok || len(ts) != 0 {
		t.Fatalf("second probe = %v %v, want it let through", ok, ts)
	}
	// both out, one answered: refused until a cooldown after the last
	s.Record(Outcome{Ref: pm}, at(13*time.Second))
	for _, d := range []time.Duration{13 * time.Second, 21 * time.Second, 22*time.Second - time.Millisecond} {
		if ok, ts := allow(d); ok || len(ts) != 0 {
			t.Fatalf("Allow at t0+%s with a probe out = %v %v, want refused", d, ok, ts)
		}
	}
	s.Begin()
	ok, ts := allow(22 * time.Second)
	if !ok || len(ts) != 1 || ts[0].From != HalfOpen || ts[0].To != HalfOpen ||
		ts[0].Reason != "1 of 2 probe(s) unanswered 10s after the last went out; letting new probes through" {
		t.Fatalf("Allow a cooldown after the last probe = %v %+v, want a new probe and HALF_OPEN->HALF_OPEN naming the unanswered one", ok, ts)
	}
	s.Rollback()
	// the batch aborted: the new round is given back, and taken again
	if ok, ts := allow(22 * time.Second); !ok || len(ts) != 1 || ts[0].To != HalfOpen {
		t.Fatalf("Allow after Rollback = %v %v, want the new round again", ok, ts)
	}
	if ok, _ := allow(23 * time.Second); !ok {
		t.Fatal("the new round's second probe was refused")
	}
	if ok, ts := allow(24 * time.Second); ok || len(ts) != 0 {
		t.Fatalf("a third probe of the round = %v %v, want refused", ok, ts)
	}
	// the new round's successes close it
	s.Record(Outcome{Ref: pm}, at(25*time.Second))
	ts = s.Record(Outcome{Ref: pm}, at(26*time.Second))
	if len(ts) != 1 || ts[0].To != Closed || s.State(pm) != Closed {
		t.Fatalf("two successes of the new round = %v, state %s; want CLOSED", ts, s.State(pm))
	}
}
