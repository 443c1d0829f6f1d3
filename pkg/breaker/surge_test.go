package breaker

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func surgeConfig() SurgeConfig {
	return SurgeConfig{Window: 10 * time.Second, MinEvents: 3, Ratio: 0.5,
		Classes: []string{"MODEL_REFUSAL", "SCHEMA_VIOLATION"}, Scopes: []Scope{PromptTemplate, ProviderModel}}
}

func newTestSurges(t *testing.T) *Surges {
	t.Helper()
	s, err := NewSurges(surgeConfig())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var tpl = Ref{Scope: PromptTemplate, Key: "refund-v9"}

// surgeStep is one Record at offset ms: of class on ref (tpl when zero);
// fires is the class of the surge it must return, "" for none.
type surgeStep struct {
	at    int64
	class string
	fires string
	ref   Ref
}

const (
	succeeded = "SUCCEEDED"
	refusal   = "MODEL_REFUSAL"
	schema    = "SCHEMA_VIOLATION"
)

// TestSurgeDetector guards the surge contract: a watched class
// fires once when, within the window, it has min_events events of a key and
// at least ratio of that key's events; it stays quiet while the ratio stays
// high, re-arms only when the ratio falls below the threshold (or the window
// empties), and keys and classes are independent.
func TestSurgeDetector(t *testing.T) {
	pm := Ref{Scope: ProviderModel, Key: "acme/m1"}
	other := Ref{Scope: PromptTemplate, Key: "support-v3"}
	tests := []struct {
		name  string
		steps []surgeStep
	}{
		{"below min events no alert", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl},
		}},
		{"below ratio no alert", []surgeStep{
			{0, succeeded, "", tpl}, {1, succeeded, "", tpl}, {2, succeeded, "", tpl}, {3, succeeded, "", tpl},
			{4, refusal, "", tpl}, {5, refusal, "", tpl}, {6, refusal, "", tpl}, // 3 of 7
		}},
		{"crossing fires exactly once and stays quiet while high", []surgeStep{
			{0, succeeded, "", tpl}, {1, succeeded, "", tpl}, {2, refusal, "", tpl}, {3, refusal, "", tpl},
			{4, refusal, refusal, tpl}, // 3 of 5
			{5, refusal, "", tpl}, {6, succeeded, "", tpl}, {7, refusal, "", tpl}, {8, succeeded, "", tpl}, {9, refusal, "", tpl},
		}},
		{"re-arms after the ratio falls below the threshold", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl}, {2, refusal, refusal, tpl},
			{3, succeeded, "", tpl}, {4, succeeded, "", tpl}, {5, refusal, "", tpl}, // 4 of 6: still high
			{6, succeeded, "", tpl}, {7, succeeded, "", tpl}, {8, succeeded, "", tpl}, // 4 of 9: re-armed
			{9, refusal, refusal, tpl}, // 5 of 10
		}},
		{"count below min events with the ratio high does not re-arm", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl}, {2, refusal, refusal, tpl},
			{9_000, refusal, "", tpl},  // 4 of 4
			{10_500, refusal, "", tpl}, // the first three left the window: 2 of 2
			{10_600, refusal, "", tpl}, // 3 of 3: the same surge
		}},
		{"re-arms when the window empties", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl}, {2, refusal, refusal, tpl},
			{20_000, refusal, "", tpl}, {20_001, refusal, "", tpl}, {20_002, refusal, refusal, tpl},
		}},
		{"events outside the window do not count", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl}, {11_000, refusal, "", tpl},
		}},
		{"unwatched classes only dilute", []surgeStep{
			{0, "NETWORK_TIMEOUT", "", tpl}, {1, "NETWORK_TIMEOUT", "", tpl}, {2, "NETWORK_TIMEOUT", "", tpl},
			{3, "NETWORK_TIMEOUT", "", tpl}, {4, refusal, "", tpl}, {5, refusal, "", tpl}, {6, refusal, "", tpl},
			{7, refusal, refusal, tpl}, // 4 of 8
		}},
		{"separate keys are independent", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl}, {2, succeeded, "", other}, {3, refusal, "", other},
			{4, refusal, refusal, tpl}, {5, refusal, "", other}, {6, refusal, refusal, other},
			{7, refusal, "", pm}, {8, refusal, "", pm}, {9, refusal, refusal, pm},
		}},
		{"classes of one key are independent", []surgeStep{
			{0, refusal, "", tpl}, {1, refusal, "", tpl}, {2, refusal, refusal, tpl},
			{3, schema, "", tpl}, {4, schema, "", tpl}, {5, schema, schema, tpl}, // 3 of 6
			{6, refusal, "", tpl}, // refusals 4 of 7 still high
		}},
		{"unwatched scope is ignored", []surgeStep{
			{0, refusal, "", Ref{Scope: Downstream, Key: "refund"}}, {1, refusal, "", Ref{Scope: Downstream, Key: "refund"}},
			{2, refusal, "", Ref{Scope: Downstream, Key: "refund"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestSurges(t)
			for i, st := range tt.steps {
				task := fmt.Sprintf("t-%d", i)
				got, fired := s.Record(st.ref, st.class, task, t0.Add(time.Duration(st.at)*time.Millisecond))
				switch {
				case st.fires == "" && fired:
					t.Fatalf("step %d (%+v): unexpected surge %+v", i, st, got)
				case st.fires != "" && !fired:
					t.Fatalf("step %d (%+v): want a %s surge, got none", i, st, st.fires)
				case fired && (got.Class != st.fires || got.Ref != st.ref || got.TaskID != task):
					t.Fatalf("step %d: surge %+v, want class %s ref %v task %s", i, got, st.fires, st.ref, task)
				}
			}
		})
	}
}

// TestSurgeReason guards the alert text: it names the key and the numbers.
func TestSurgeReason(t *testing.T) {
	cfg := surgeConfig()
	cfg.Window, cfg.MinEvents, cfg.Ratio = 5*time.Minute, 2, 0.3
	s, err := NewSurges(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{succeeded, succeeded, succeeded, refusal} {
		s.Record(tpl, c, "t-x", t0)
	}
	got, fired := s.Record(tpl, refusal, "t-y", t0)
	want := "surge: 2 of 5 events for prompt template refund-v9 in the last 5m are MODEL_REFUSAL (ratio 0.40 >= 0.30)"
	if !fired || got.Reason != want || got.Count != 2 || got.Total != 5 || got.TaskID != "t-y" || !got.At.Equal(t0) {
		t.Errorf("surge = %+v (fired %v)\nwant reason %q", got, fired, want)
	}
	pm := Ref{Scope: ProviderModel, Key: "acme/m1"}
	s.Record(pm, refusal, "t-1", t0)
	if got, _ := s.Record(pm, refusal, "t-2", t0); got.Reason != "surge: 2 of 2 events for model acme/m1 in the last 5m are MODEL_REFUSAL (ratio 1.00 >= 0.30)" {
		t.Errorf("provider/model reason = %q", got.Reason)
	}
}

// TestSurgeEviction guards bounded memory: at MaxSurgeKeys idle keys are
// forgotten first, then keys not in a surge; a key in a surge is kept while
// others can go, so it does not alert again.
func TestSurgeEviction(t *testing.T) {
	defer func(n int) { MaxSurgeKeys = n }(MaxSurgeKeys)
	MaxSurgeKeys = 3
	s := newTestSurges(t)
	at := func(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	hot := Ref{Scope: PromptTemplate, Key: "hot"}
	for i := range 3 {
		if _, fired := s.Record(hot, refusal, "h", at(int64(10_000+i))); fired != (i == 2) {
			t.Fatalf("hot step %d: fired %v", i, fired)
		}
	}
	s.Record(Ref{Scope: PromptTemplate, Key: "old"}, succeeded, "o", at(0))
	s.Record(Ref{Scope: PromptTemplate, Key: "busy"}, succeeded, "b", at(15_000))
	// at 15.5 s only "old" is idle: it goes, "busy" and "hot" stay
	s.Record(Ref{Scope: PromptTemplate, Key: "new"}, succeeded, "n", at(15_500))
	for _, k := range []string{"hot", "busy", "new"} {
		if _, kept := s.keys.Get(Ref{Scope: PromptTemplate, Key: k}); !kept || s.Len() != 3 {
			t.Fatalf("key %s kept %v, keys %d; want hot, busy, new", k, kept, s.Len())
		}
	}
	// nothing is idle at 16 s: the keys not in a surge go, hot stays and
	// does not alert again
	s.Record(Ref{Scope: PromptTemplate, Key: "x"}, succeeded, "x", at(16_000))
	if _, kept := s.keys.Get(hot); !kept || s.Len() != 2 {
		t.Fatalf("hot kept %v, keys %d; want hot and x", kept, s.Len())
	}
	if _, fired := s.Record(hot, refusal, "h", at(16_200)); fired {
		t.Error("hot alerted again after an eviction")
	}
	// every key in a surge: all are forgotten rather than exceed the bound
	s2 := newTestSurges(t)
	for k := range 5 {
		ref := Ref{Scope: PromptTemplate, Key: fmt.Sprint(k)}
		for i := range 3 {
			s2.Record(ref, refusal, "t", at(int64(i)))
		}
		if s2.Len() > MaxSurgeKeys {
			t.Fatalf("keys = %d > MaxSurgeKeys", s2.Len())
		}
	}
}

// TestSurgeConfigValidate guards the detector's config: each bad field is
// named.
func TestSurgeConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		field string
		mod   func(*SurgeConfig)
	}{
		{"Window", func(c *SurgeConfig) { c.Window = 0 }},
		{"MinEvents", func(c *SurgeConfig) { c.MinEvents = 0 }},
		{"Ratio", func(c *SurgeConfig) { c.Ratio = 1.5 }},
		{"Scopes", func(c *SurgeConfig) { c.Scopes = []Scope{7} }},
	} {
		t.Run(tt.field, func(t *testing.T) {
			c := surgeConfig()
			tt.mod(&c)
			if _, err := NewSurges(c); err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("NewSurges = %v, want an error naming %s", err, tt.field)
			}
		})
	}
}
