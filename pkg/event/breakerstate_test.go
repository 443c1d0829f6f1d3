package event

import (
	"strings"
	"testing"
	"time"
)

// Guards the breakers topic's value: a BreakerState survives encoding and
// decoding whole, a reader ignores fields it does not know (a later version
// may add some), and a state that cannot be applied is refused with an
// error naming the field.
func TestBreakerStateRoundTripAndRefusals(t *testing.T) {
	opened := At(time.Date(2030, 1, 1, 10, 0, 0, 0, time.UTC))
	s := BreakerState{Scope: "PROMPT_TEMPLATE", Key: "refund-v9", State: "OPEN", Latched: true, OpenedAt: &opened,
		Reason: "MODEL_HALLUCINATION: open until a person resets it", UpdatedAt: opened, Instance: "router-a"}
	v, err := EncodeBreakerState(&s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBreakerState(v)
	if err != nil || got.Scope != s.Scope || got.Key != s.Key || got.State != s.State || !got.Latched ||
		!got.OpenedAt.Equal(opened.Time) || got.Reason != s.Reason || !got.UpdatedAt.Equal(opened.Time) || got.Instance != s.Instance {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, s)
	}
	if _, err := DecodeBreakerState([]byte(strings.Replace(string(v), `{`, `{"probes":3,`, 1))); err != nil {
		t.Errorf("an unknown field was refused: %v", err)
	}
	for _, c := range []struct{ json, field string }{
		{`{"key":"k","state":"OPEN","opened_at":"2030-01-01T10:00:00Z","reason":"r","updated_at":"2030-01-01T10:00:00Z"}`, "scope"},
		{`{"scope":"PROVIDER_MODEL","key":"k","state":"SHUT","reason":"r","updated_at":"2030-01-01T10:00:00Z"}`, "state"},
		{`{"scope":"PROVIDER_MODEL","key":"k","state":"OPEN","reason":"r","updated_at":"2030-01-01T10:00:00Z"}`, "opened_at"},
		{`{"scope":"PROVIDER_MODEL","key":"k","state":"CLOSED","latched":true,"reason":"r","updated_at":"2030-01-01T10:00:00Z"}`, "latched"},
		{`{"scope":"PROVIDER_MODEL","key":"k","state":"HALF_OPEN","reset":true,"reason":"r","updated_at":"2030-01-01T10:00:00Z"}`, "reset"},
		{`{"scope":"PROVIDER_MODEL","key":"k","state":"CLOSED","reason":"r"}`, "updated_at"},
	} {
		if _, err := DecodeBreakerState([]byte(c.json)); err == nil || !strings.Contains(err.Error(), "field "+c.field) {
			t.Errorf("%s: error %v, want one naming field %s", c.json, err, c.field)
		}
	}
	if _, err := DecodeBreakerState([]byte(`not json`)); err == nil {
		t.Error("a value that is not JSON was accepted")
	}
}

// AppendBreakerItemKey builds the key BreakerItemKey builds, after what the
// buffer held.
func TestAppendBreakerItemKeyIsBreakerItemKey(t *testing.T) {
	for _, c := range [][3]string{{"PROMPT_TEMPLATE", "tmpl-1", "task-9"}, {"PROVIDER_MODEL", "acme/m1", "a/b"}, {"", "", ""}} {
		want := BreakerItemKey(BreakerScope(c[0]), c[1], c[2])
		if got := string(AppendBreakerItemKey([]byte("x"), BreakerScope(c[0]), c[1], c[2])); got != "x"+want {
			t.Fatalf("%q: %q, want %q", c, got, "x"+want)
		}
	}
}
