package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// TestSurgeBadValues guards the surge section of the policy file: a bad value
// is one *FieldError naming the key path, its line, and what is allowed.
func TestSurgeBadValues(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown class", "surge:\n  classes: [MODEL_REFUSAL, MODEL_REFUSED]\n",
			`policy: line 2: surge.classes[1]: must be one of [NETWORK_TIMEOUT AUTH_FAILED INPUT_QUALITY_ISSUE MODEL_REFUSAL SCHEMA_VIOLATION VALIDATION_FIXABLE DUPLICATE_EXECUTION BUSINESS_REJECTED MODEL_HALLUCINATION RATE_LIMITED RATE_LIMIT_EXCEEDED BUDGET_EXHAUSTED OUTCOME_UNKNOWN PARAMS_MISMATCH UNCLASSIFIED INVALID_INPUT], got "MODEL_REFUSED"`},
		{"SUCCEEDED is no surge", "surge:\n  classes: [SUCCEEDED]\n",
			`policy: line 2: surge.classes[0]: must be one of [NETWORK_TIMEOUT`},
		{"class listed twice", "surge:\n  classes: [RATE_LIMITED, RATE_LIMITED]\n",
			`policy: line 2: surge.classes[1]: RATE_LIMITED is listed twice`},
		{"unknown scope", "surge:\n  scopes: [DOWNSTREAM]\n",
			`policy: line 2: surge.scopes[0]: must be one of [PROMPT_TEMPLATE PROVIDER_MODEL], got "DOWNSTREAM"`},
		{"ratio above 1", "# header\nsurge:\n  ratio: 1.5\n",
			`policy: line 3: surge.ratio: must be > 0 and <= 1, got 1.5`},
		{"zero ratio", "surge:\n  ratio: 0\n",
			`policy: line 2: surge.ratio: must be > 0 and <= 1, got 0`},
		{"zero min events", "surge:\n  min_events: 0\n",
			`policy: line 2: surge.min_events: must be > 0, got 0`},
		{"negative window", "surge:\n  window_ms: -1\n",
			`policy: line 2: surge.window_ms: must be > 0, got -1`},
		{"misspelled key", "surge:\n  min_event: 3\n",
			`policy: line 2: surge.min_event: unknown key; allowed keys: classes, min_events, ratio, scopes, window_ms`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml))
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse = %v, want an ErrInvalid", err)
			}
			if got := err.Error(); !strings.HasPrefix(got, tt.want) {
				t.Errorf("error %q\nwant prefix %q", got, tt.want)
			}
		})
	}

	// through ParseFile, the message names the file too
	path := "surge.yaml"
	_, err := ParseFile(path, []byte("surge:\n  classes: [REFUSAL]\n"))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.File != path || fe.Line != 2 || fe.Path != "surge.classes[0]" {
		t.Errorf("ParseFile = %v, want a FieldError for %s:2 surge.classes[0]", err, path)
	}
}

// TestSurgeDefaultsAndOverride guards the surge defaults and "a
// policy file sets only what it changes": a list replaces the default list,
// other keys keep their defaults, and an empty class list is allowed (off).
func TestSurgeDefaultsAndOverride(t *testing.T) {
	d := Default().Surge
	want := Surge{WindowMs: 300_000, MinEvents: 10, Ratio: 0.3,
		Classes: []event.Class{event.ClassModelRefusal, event.ClassSchemaViolation, event.ClassHallucination,
			event.ClassValidationFixable, event.ClassRateLimited},
		Scopes: []event.BreakerScope{"PROMPT_TEMPLATE", "PROVIDER_MODEL"}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("Default().Surge = %+v\nwant %+v", d, want)
	}
	p, err := Parse([]byte("surge:\n  min_events: 5\n  ratio: 0.5\n  scopes: [PROMPT_TEMPLATE]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want.MinEvents, want.Ratio, want.Scopes = 5, 0.5, []event.BreakerScope{"PROMPT_TEMPLATE"}
	if !reflect.DeepEqual(p.Surge, want) {
		t.Errorf("surge = %+v\nwant %+v", p.Surge, want)
	}
	if p, err := Parse([]byte("surge:\n  classes: []\n")); err != nil {
		t.Errorf("an empty class list: %v", err)
	} else if len(p.Surge.Classes) != 0 {
		t.Errorf("an empty class list kept classes %v", p.Surge.Classes)
	}
}
