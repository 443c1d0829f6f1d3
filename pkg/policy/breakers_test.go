package policy

import (
	"errors"
	"testing"
)

// TestBreakersValidate guards the breakers section: a bad number is one
// *FieldError naming its full path.
func TestBreakersValidate(t *testing.T) {
	tests := []struct {
		path string
		mod  func(*Policy)
	}{
		{"breakers.provider_model.window_ms", func(p *Policy) { p.Breakers.ProviderModel.WindowMs = 0 }},
		{"breakers.provider_model.min_requests", func(p *Policy) { p.Breakers.ProviderModel.MinRequests = 0 }},
		{"breakers.downstream.failure_ratio", func(p *Policy) { p.Breakers.Downstream.FailureRatio = 1.01 }},
		{"breakers.prompt_template.failure_ratio", func(p *Policy) { p.Breakers.PromptTemplate.FailureRatio = 0 }},
		{"breakers.downstream.cooldown_ms", func(p *Policy) { p.Breakers.Downstream.CooldownMs = -5 }},
		{"breakers.prompt_template.half_open_probes", func(p *Policy) { p.Breakers.PromptTemplate.HalfOpenProbes = 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			p := Default()
			tt.mod(p)
			var fe *FieldError
			if err := p.Validate(); !errors.As(err, &fe) || fe.Path != tt.path {
				t.Errorf("Validate() = %v, want a FieldError for %s", err, tt.path)
			}
		})
	}
}

// TestBreakersPartialOverride guards "a policy file sets only what it
// changes" for the breakers section.
func TestBreakersPartialOverride(t *testing.T) {
	p, err := Parse([]byte("breakers:\n  provider_model: {cooldown_ms: 2000, min_requests: 3}\n"))
	if err != nil {
		t.Fatal(err)
	}
	d := Default()
	pm := p.Breakers.ProviderModel
	if pm.CooldownMs != 2000 || pm.MinRequests != 3 || pm.WindowMs != d.Breakers.ProviderModel.WindowMs ||
		p.Breakers.Downstream != d.Breakers.Downstream {
		t.Errorf("breakers = %+v", p.Breakers)
	}
}
