package policy

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Override changes class sections of the policy for the events its Match
// selects. Decide picks, for each event, the most specific override that
// matches it (the most match fields other than "*") and decides with the base
// policy's sections replaced by the override's; the decision names it
// (event.Decision.Override). Two overrides of equal specificity that can match
// one event are an error (Validate), so at most one override is the most
// specific for any event.
//
// Class sections are overridable, and the breakers' limits: an override's
// `breakers` section sets the window, thresholds, cooldown and probes of
// the breakers its match names (provider_model for a match on provider
// and model alone, downstream for one on action alone, prompt_template for
// one on prompt_template alone; BreakerLimits). The breakers themselves,
// one per key shared by every event of the key, are unchanged. The shared
// retry budget, the task budget (budget_exhausted), the owners and the
// other top-level settings are the base's for every event.
type Override struct {
	// Name names the override in decisions, `policy explain` and errors:
	// required, unique, of a-z, 0-9, '.', '_' and '-'.
	Name string `yaml:"name"`
	// Match selects the events the override applies to.
	Match Match `yaml:"match"`

	// The class sections the override changes; nil keeps the base's. A
	// section read from a file is the base's section with the keys the file
	// gives replaced (Parse fills in the others); a section set in Go is used
	// as it is.
	NetworkTimeout     *NetworkTimeout     `yaml:"network_timeout"`
	AuthFailed         *AuthFailed         `yaml:"auth_failed"`
	InputQuality       *InputQuality       `yaml:"input_quality_issue"`
	ModelRefusal       *ModelRefusal       `yaml:"model_refusal"`
	SchemaViolation    *SchemaViolation    `yaml:"schema_violation"`
	ValidationFixable  *ValidationFixable  `yaml:"validation_fixable"`
	DuplicateExecution *DuplicateExecution `yaml:"duplicate_execution"`
	BusinessRejected   *BusinessRejected   `yaml:"business_rejected"`
	Hallucination      *Hallucination      `yaml:"model_hallucination"`
	RateLimited        *RateLimited        `yaml:"rate_limited"`
	OutcomeUnknown     *Escalation         `yaml:"outcome_unknown"`
	ParamsMismatch     *Escalation         `yaml:"params_mismatch"`
	Unclassified       *Escalation         `yaml:"unclassified"`

	// Breakers are the limits of the breakers the match names; nil keeps
	// the base's. Read from a file, it is the base's breakers section with
	// the keys the file gives replaced. A scope whose limits differ from
	// the base's must be one the match names alone (see Override).
	Breakers *Breakers `yaml:"breakers"`
}

// Match selects events by four of their fields. Each is an exact value
// (case matters), "*" for any value, or a prefix ending in "*" ("gpt-4*"
// matches gpt-4, gpt-4o and gpt-4.1). In Go the empty string means any,
// like "*"; in a file a match value must not be empty.
type Match struct {
	Provider       string `yaml:"provider"`
	Model          string `yaml:"model"`
	Action         string `yaml:"action"`
	PromptTemplate string `yaml:"prompt_template"`
}

// matchKeys are Match's yaml keys, in the order of Match.patterns.
var matchKeys = [4]string{"provider", "model", "action", "prompt_template"}

func (m *Match) values() [4]string {
	return [4]string{m.Provider, m.Model, m.Action, m.PromptTemplate}
}

// String lists the match's fields other than "*", e.g.
// "provider=acme model=gpt-4*"; "*" when it has none.
func (m Match) String() string {
	var parts []string
	for i, v := range m.values() {
		if v != "" && v != "*" {
			parts = append(parts, matchKeys[i]+"="+v)
		}
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, " ")
}

// notOverridable says why a top-level key cannot appear in an override.
var notOverridable = map[string]string{
	"retry_budget":     "the shared retry budget counts all of a task's retries, whatever model made them; set it at the top level",
	"budget_exhausted": "a task's budget is one for all its attempts, which may run on different models; set it at the top level",
	"owners":           "owners are defined once, at the top level; an override's sections name them",
	"default_sla_ms":   "a task's SLA is the task's, not one event's; set it at the top level",
	"surge":            "surge alerts already watch each provider/model and prompt template; set them at the top level",
	"cost_prevented":   "cost prevented is measured against one baseline for every task; set it at the top level",
	"review_loop":      "the review loop is the same for every task; set it at the top level",
	"overrides":        "overrides do not nest",
}

// pattern is one compiled match field.
type pattern struct {
	s      string // the exact value, or the prefix
	prefix bool
	any    bool
}

func compilePattern(s string) pattern {
	switch {
	case s == "" || s == "*":
		return pattern{any: true}
	case strings.HasSuffix(s, "*"):
		return pattern{s: s[:len(s)-1], prefix: true}
	}
	return pattern{s: s}
}

func (p pattern) matches(v string) bool {
	switch {
	case p.any:
		return true
	case p.prefix:
		return strings.HasPrefix(v, p.s)
	}
	return v == p.s
}

// overlaps reports whether some value matches both p and q.
func (p pattern) overlaps(q pattern) bool {
	switch {
	case p.any || q.any:
		return true
	case p.prefix && q.prefix:
		return strings.HasPrefix(p.s, q.s) || strings.HasPrefix(q.s, p.s)
	case p.prefix:
		return strings.HasPrefix(q.s, p.s)
	case q.prefix:
		return strings.HasPrefix(p.s, q.s)
	}
	return p.s == q.s
}

// common describes the values matching both p and q (which overlap): the
// exact value, or the longer prefix and "*"; "" when both match any value.
func common(p, q pattern) string {
	switch {
	case p.any && q.any:
		return ""
	case p.any:
		return q.String()
	case q.any, !p.prefix:
		return p.String()
	case !q.prefix:
		return q.String()
	case len(q.s) > len(p.s):
		return q.String()
	}
	return p.String()
}

func (p pattern) String() string {
	switch {
	case p.any:
		return "*"
	case p.prefix:
		return p.s + "*"
	}
	return p.s
}

// compiledOverride is an Override ready for Decide: its match compiled and
// the whole policy it decides with built once.
type compiledOverride struct {
	name        string
	index       int // in Policy.Overrides
	match       [4]pattern
	specificity int
	policy      *Policy
	// breakers holds, per breaker.Scope, the limits the override sets for
	// the breakers of that scope its match selects; nil: the base's
	breakers [3]*breaker.Config
	// decides is set when the override changes a class section: an override
	// of breaker limits alone decides no event (Decide and OverrideFor pass
	// it by) and ties only with another one setting the same breakers
	decides bool
}

func (o *compiledOverride) matches(ev *event.TaskEvent) bool {
	return o.match[0].matches(ev.Provider) && o.match[1].matches(ev.Model) &&
		o.match[2].matches(ev.Action) && o.match[3].matches(ev.PromptTemplate)
}

// overlaps reports whether one event can match both o and q.
func (o *compiledOverride) overlaps(q *compiledOverride) bool {
	for i := range o.match {
		if !o.match[i].overlaps(q.match[i]) {
			return false
		}
	}
	return true
}

// resolve returns the most specific override matching ev, or nil. The
// overrides are sorted most specific first, and two of equal specificity
// never both match (compileOverrides), so the first match is the one.
func (p *Policy) resolve(ev *event.TaskEvent) *compiledOverride {
	for i := range p.overrides {
		if o := &p.overrides[i]; o.decides && o.matches(ev) {
			return o
		}
	}
	return nil
}

// OverrideFor returns the override that decides ev (the most specific one
// matching its provider, model, action and prompt template) and true, or
// false when the base policy decides it. The policy must be validated.
func (p *Policy) OverrideFor(ev *event.TaskEvent) (Override, bool) {
	o := p.resolve(ev)
	if o == nil {
		return Override{}, false
	}
	return p.Overrides[o.index], true
}

// Sections lists the yaml keys of the class sections o changes.
func (o *Override) Sections() []string {
	var out []string
	v := reflect.ValueOf(o).Elem()
	t := v.Type()
	for i := range t.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			out = append(out, name)
		}
	}
	return out
}

// overridableSections lists the yaml keys of the class sections an override
// may change.
func overridableSections() []string {
	var out []string
	t := reflect.TypeFor[Override]()
	for i := range t.NumField() {
		if t.Field(i).Type.Kind() == reflect.Pointer {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			out = append(out, name)
		}
	}
	return out
}

// with returns the policy p with o's sections in place of its own, without
// overrides.
func (p *Policy) with(o *Override) *Policy {
	q := *p
	q.Overrides, q.overrides = nil, nil
	if o.NetworkTimeout != nil {
		q.NetworkTimeout = *o.NetworkTimeout
	}
	if o.AuthFailed != nil {
		q.AuthFailed = *o.AuthFailed
	}
	if o.InputQuality != nil {
		q.InputQuality = *o.InputQuality
	}
	if o.ModelRefusal != nil {
		q.ModelRefusal = *o.ModelRefusal
		q.refusalSet = compilePhrases(q.ModelRefusal.allPhrases())
	}
	if o.SchemaViolation != nil {
		q.SchemaViolation = *o.SchemaViolation
	}
	if o.ValidationFixable != nil {
		q.ValidationFixable = *o.ValidationFixable
	}
	if o.DuplicateExecution != nil {
		q.DuplicateExecution = *o.DuplicateExecution
	}
	if o.BusinessRejected != nil {
		q.BusinessRejected = *o.BusinessRejected
	}
	if o.Hallucination != nil {
		q.Hallucination = *o.Hallucination
	}
	if o.RateLimited != nil {
		q.RateLimited = *o.RateLimited
	}
	if o.OutcomeUnknown != nil {
		q.OutcomeUnknown = *o.OutcomeUnknown
	}
	if o.ParamsMismatch != nil {
		q.ParamsMismatch = *o.ParamsMismatch
	}
	if o.Unclassified != nil {
		q.Unclassified = *o.Unclassified
	}
	if o.Breakers != nil {
		q.Breakers = *o.Breakers
	}
	return &q
}

// compileOverrides checks p.Overrides against the valid base policy p and
// compiles them, most specific first (file order among equals). The first
// problem is a *FieldError naming the override's field.
func (p *Policy) compileOverrides() ([]compiledOverride, error) {
	if len(p.Overrides) == 0 {
		return nil, nil
	}
	out := make([]compiledOverride, 0, len(p.Overrides))
	for i := range p.Overrides {
		o := &p.Overrides[i]
		path := fmt.Sprintf("overrides[%d]", i)
		fail := func(field, format string, args ...any) error {
			fe := &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
			if field != "" {
				fe.Path += "." + field
			}
			return fe
		}
		switch {
		case o.Name == "":
			return nil, fail("name", "must be set: a name of a-z, 0-9, '.', '_' and '-', unique among the overrides")
		case strings.Trim(o.Name, "abcdefghijklmnopqrstuvwxyz0123456789._-") != "":
			return nil, fail("name", "must hold only a-z, 0-9, '.', '_' and '-', got %q", o.Name)
		}
		if j := slices.IndexFunc(p.Overrides[:i], func(x Override) bool { return x.Name == o.Name }); j >= 0 {
			return nil, fail("name", "%q is the name of overrides[%d] too; names must be unique", o.Name, j)
		}
		c := compiledOverride{name: o.Name, index: i}
		for k, v := range o.Match.values() {
			if strings.Contains(strings.TrimSuffix(v, "*"), "*") {
				return nil, fail("match."+matchKeys[k], `must be an exact value, "*" for any, or a prefix ending in "*" (gpt-4*), got %q (override %s)`, v, o.Name)
			}
			c.match[k] = compilePattern(v)
			if !c.match[k].any {
				c.specificity++
			}
		}
		if c.specificity == 0 {
			return nil, fail("match", `must give at least one of %s a value other than "*": an override of every event is the base policy (override %s)`,
				strings.Join(matchKeys[:], ", "), o.Name)
		}
		if len(o.Sections()) == 0 {
			return nil, fail("", "changes nothing: give at least one class section to change, of %s (override %s)",
				strings.Join(overridableSections(), ", "), o.Name)
		}
		c.policy = p.with(o)
		v := &validator{p: c.policy}
		v.check()
		if fe, ok := v.err.(*FieldError); ok {
			fe.Path = join(path, fe.Path)
			fe.Msg += " (override " + o.Name + ")"
			return nil, fe
		}
		if o.Breakers != nil {
			if err := c.compileBreakers(p, o, path); err != nil {
				return nil, err
			}
		}
		c.decides = slices.ContainsFunc(o.Sections(), func(s string) bool { return s != "breakers" })
		for j := range out {
			q := &out[j]
			if q.specificity != c.specificity || !q.overlaps(&c) {
				continue
			}
			if q.decides && c.decides {
				return nil, &FieldError{Path: path, Msg: tie(q, &c)}
			}
			for _, bs := range breakerScopes {
				if q.breakers[bs.scope] != nil && c.breakers[bs.scope] != nil {
					return nil, &FieldError{Path: path + ".breakers." + bs.key, Msg: tie(q, &c)}
				}
			}
		}
		out = append(out, c)
	}
	slices.SortStableFunc(out, func(a, b compiledOverride) int { return b.specificity - a.specificity })
	return out, nil
}

// breakerScopes are the breakers sections of an override: each scope's
// yaml key, the match fields (indexes of Match.values) that key its
// breakers, and its limits in a Breakers.
var breakerScopes = [3]struct {
	scope  breaker.Scope
	key    string
	fields []int
	limits func(*Breakers) Breaker
}{
	{breaker.ProviderModel, "provider_model", []int{0, 1}, func(b *Breakers) Breaker { return b.ProviderModel }},
	{breaker.Downstream, "downstream", []int{2}, func(b *Breakers) Breaker { return b.Downstream }},
	{breaker.PromptTemplate, "prompt_template", []int{3}, func(b *Breakers) Breaker { return b.PromptTemplate }},
}

// compileBreakers keeps the limits o sets for each breaker scope (those
// that differ from the base's), after checking that its match names that
// scope's key fields alone: a breaker is one per key, whatever else its
// events carry, so limits for the breakers of provider acme's refunds
// would have no breaker to apply to.
func (c *compiledOverride) compileBreakers(p *Policy, o *Override, path string) error {
	for _, bs := range breakerScopes {
		lim := bs.limits(o.Breakers)
		if lim == bs.limits(&p.Breakers) {
			continue
		}
		for k, pat := range c.match {
			if !pat.any && !slices.Contains(bs.fields, k) {
				var names []string
				for _, f := range bs.fields {
					names = append(names, matchKeys[f])
				}
				return &FieldError{Path: path + ".breakers." + bs.key, Msg: fmt.Sprintf(
					"sets the limits of the %s breakers, which are keyed by %s alone, but the match also names %s=%s: "+
						"put these limits in an override whose match names only %s (override %s)",
					bs.key, strings.Join(names, " and "), matchKeys[k], pat, strings.Join(names, " and "), o.Name)}
			}
		}
		cfg := lim.Config()
		c.breakers[bs.scope] = &cfg
	}
	return nil
}

// BreakerLimits returns the limits of the breaker of ref: those of the most
// specific override whose match selects its key and that sets limits for
// its scope (and that override's name), or the base policy's. A
// provider/model key is "provider/model", split at its first "/". The
// policy must be validated.
func (p *Policy) BreakerLimits(ref breaker.Ref) (breaker.Config, string) {
	if o := p.breakerOverride(ref); o != nil {
		return *o.breakers[ref.Scope], o.name
	}
	switch ref.Scope {
	case breaker.Downstream:
		return p.Breakers.Downstream.Config(), ""
	case breaker.PromptTemplate:
		return p.Breakers.PromptTemplate.Config(), ""
	}
	return p.Breakers.ProviderModel.Config(), ""
}

// BreakerLimitsFunc is BreakerLimits for a breaker.Set (Set.SetLimits): the
// limits of ref's override, nil for the base's. Nil when no override sets
// breaker limits.
func (p *Policy) BreakerLimitsFunc() func(breaker.Ref) *breaker.Config {
	for i := range p.overrides {
		if p.overrides[i].breakers != [3]*breaker.Config{} {
			return func(ref breaker.Ref) *breaker.Config {
				if o := p.breakerOverride(ref); o != nil {
					return o.breakers[ref.Scope]
				}
				return nil
			}
		}
	}
	return nil
}

func (p *Policy) breakerOverride(ref breaker.Ref) *compiledOverride {
	if int(ref.Scope) >= len(breakerScopes) {
		return nil
	}
	for i := range p.overrides { // most specific first
		o := &p.overrides[i]
		if o.breakers[ref.Scope] == nil {
			continue
		}
		switch ref.Scope {
		case breaker.ProviderModel:
			provider, model, _ := strings.Cut(ref.Key, "/")
			if o.match[0].matches(provider) && o.match[1].matches(model) {
				return o
			}
		case breaker.Downstream:
			if o.match[2].matches(ref.Key) {
				return o
			}
		case breaker.PromptTemplate:
			if o.match[3].matches(ref.Key) {
				return o
			}
		}
	}
	return nil
}

// tie is the error of two equally specific overrides a and b that can both
// match one event.
func tie(a, b *compiledOverride) string {
	var both []string
	for k := range a.match {
		if v := common(a.match[k], b.match[k]); v != "" {
			both = append(both, matchKeys[k]+"="+v)
		}
	}
	return fmt.Sprintf("override %q and override %q (overrides[%d]) are ambiguous: both match an event with %s, and both are as specific "+
		"(%d of provider, model, action, prompt_template set); make one more specific or make their matches exclusive",
		b.name, a.name, a.index, strings.Join(both, " "), a.specificity)
}

// inheritOverrides completes the class sections of the overrides that Parse
// decoded from the file's node root: each section starts from the base
// policy's section, and the keys the file gives replace its values. It also
// rejects an empty match value, which in a file is a mistake rather than
// "any".
func inheritOverrides(p *Policy, root *yaml.Node) error {
	list := mappingValue(root, "overrides")
	if list == nil || list.Kind != yaml.SequenceNode {
		return nil
	}
	base := reflect.ValueOf(p).Elem()
	for i, item := range list.Content {
		if item.Kind == yaml.AliasNode {
			item = item.Alias
		}
		if item.Kind != yaml.MappingNode || i >= len(p.Overrides) {
			continue
		}
		ov := reflect.ValueOf(&p.Overrides[i]).Elem()
		for k := 0; k+1 < len(item.Content); k += 2 {
			key, val := item.Content[k].Value, item.Content[k+1]
			path := fmt.Sprintf("overrides[%d].%s", i, key)
			if key == "match" {
				if err := nonEmptyMatch(val, path); err != nil {
					return err
				}
				continue
			}
			from, ok := fieldByTag(base, key)
			to, ok2 := fieldByTag(ov, key)
			if !ok || !ok2 || to.Kind() != reflect.Pointer {
				continue
			}
			sec := reflect.New(from.Type())
			sec.Elem().Set(from)
			if err := val.Decode(sec.Interface()); err != nil {
				return &FieldError{Line: val.Line, Path: path, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
			}
			to.Set(sec)
		}
	}
	return nil
}

func nonEmptyMatch(n *yaml.Node, path string) error {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for k := 0; k+1 < len(n.Content); k += 2 {
		if v := n.Content[k+1]; v.Kind == yaml.ScalarNode && v.Value == "" {
			return &FieldError{Line: v.Line, Path: path + "." + n.Content[k].Value,
				Msg: `must not be empty: give an exact value, "*" for any, or a prefix ending in "*"`}
		}
	}
	return nil
}

// mappingValue returns the value of key in mapping n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			v := n.Content[i+1]
			if v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			return v
		}
	}
	return nil
}

// fieldByTag returns the field of struct v whose yaml key is key (not
// looking into inline fields).
func fieldByTag(v reflect.Value, key string) (reflect.Value, bool) {
	t := v.Type()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name == key && t.Field(i).IsExported() {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}
