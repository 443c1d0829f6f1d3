package event

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// BreakerState is the value of a record on the breakers topic: the shared
// state of one breaker after a change an instance made, keyed by
// BreakerStateKey. The topic is compacted, so it keeps the latest state of
// every breaker; every router instance reads it whole before it reports
// ready and follows it while it runs.
type BreakerState struct {
	// Scope is PROVIDER_MODEL, DOWNSTREAM or PROMPT_TEMPLATE.
	Scope BreakerScope `json:"scope"`
	// Key is the breaker's key within its scope, e.g. "openai/gpt-4o".
	Key string `json:"key"`
	// State is CLOSED, OPEN or HALF_OPEN.
	State BreakerStateName `json:"state"`
	// Latched is true for a breaker held OPEN until a person resets it.
	Latched bool `json:"latched"`
	// Reset is true for the CLOSED state a person's reset left (`faultrouter
	// breaker reset`, or a reviewer deciding a hallucination's item): the
	// only change that closes a latched breaker.
	Reset bool `json:"reset,omitempty"`
	// OpenedAt is when the breaker opened; absent unless State is OPEN.
	OpenedAt *Timestamp `json:"opened_at,omitempty"`
	// Reason is why it changed (the transition's reason).
	Reason string `json:"reason"`
	// UpdatedAt is when it changed; a reader ignores a state older than the
	// last change it made or applied to that breaker.
	UpdatedAt Timestamp `json:"updated_at"`
	// Instance is the router instance that changed it.
	Instance string `json:"instance"`
}

// BreakerStateKey is the record key of a breaker's state: "<scope>/<key>".
func BreakerStateKey(scope BreakerScope, key string) string { return string(scope) + "/" + key }

// BreakerStateName is a breaker's state as every record, page and report
// writes it (BreakerState.State, BreakerEvent.From and .To): CLOSED, OPEN
// or HALF_OPEN. pkg/breaker's State prints these.
type BreakerStateName string

// BreakerScope is a breaker's scope as every record, page and report writes
// it (BreakerState.Scope, BreakerItem.Scope, BreakerEvent.Scope):
// PROVIDER_MODEL, DOWNSTREAM or PROMPT_TEMPLATE. pkg/breaker's Scope prints
// these; the policy's surge scopes are two of them.
type BreakerScope string

// The breaker states and scopes, declared here once.
const (
	BreakerClosed   BreakerStateName = "CLOSED"
	BreakerOpen     BreakerStateName = "OPEN"
	BreakerHalfOpen BreakerStateName = "HALF_OPEN"

	ScopeProviderModel  BreakerScope = "PROVIDER_MODEL"
	ScopeDownstream     BreakerScope = "DOWNSTREAM"
	ScopePromptTemplate BreakerScope = "PROMPT_TEMPLATE"
)

// BreakerStateNames and BreakerScopes are every state and scope, in the
// order pages and metrics list them.
var (
	BreakerStateNames = []BreakerStateName{BreakerClosed, BreakerOpen, BreakerHalfOpen}
	BreakerScopes     = []BreakerScope{ScopeProviderModel, ScopeDownstream, ScopePromptTemplate}
)

// Validate checks the fields a BreakerState must have.
func (s *BreakerState) Validate() error {
	switch {
	case s.Scope == "":
		return &FieldError{Field: "scope", Msg: "required, a non-empty string"}
	case s.Key == "":
		return &FieldError{Field: "key", Msg: "required, a non-empty string"}
	case !slices.Contains(BreakerStateNames, s.State):
		return &FieldError{Field: "state", Msg: fmt.Sprintf("must be one of %v, got %q", BreakerStateNames, s.State)}
	case s.State == BreakerOpen && (s.OpenedAt == nil || s.OpenedAt.IsZero()):
		return &FieldError{Field: "opened_at", Msg: "required while state is OPEN"}
	case s.Latched && s.State != BreakerOpen:
		return &FieldError{Field: "latched", Msg: "true only while state is OPEN, got state " + string(s.State)}
	case s.Reset && s.State != BreakerClosed:
		return &FieldError{Field: "reset", Msg: "true only with state CLOSED, got state " + string(s.State)}
	case s.UpdatedAt.IsZero():
		return &FieldError{Field: "updated_at", Msg: "required, an RFC 3339 time or integer milliseconds"}
	}
	return nil
}

// EncodeBreakerState encodes s as JSON.
func EncodeBreakerState(s *BreakerState) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// DecodeBreakerState decodes and validates one BreakerState. Fields it does
// not know are ignored, so that a reader keeps working when a later version
// adds some.
func DecodeBreakerState(b []byte) (BreakerState, error) {
	var s BreakerState
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("breaker state: %w", err)
	}
	if err := s.Validate(); err != nil {
		return s, fmt.Errorf("breaker state: %w", err)
	}
	return s, nil
}

// BreakerItem is a record on the breakers topic for one open review item of
// a hallucination that latched its prompt template's breaker: a template
// stays latched until every such item is decided (or a person resets the
// breaker by hand). It is keyed by BreakerItemKey; deciding the item writes a
// tombstone under the same key, with the deciding instance in a
// faultrouter.breaker.instance header.
type BreakerItem struct {
	// Scope and Key name the latched breaker (Scope is PROMPT_TEMPLATE).
	Scope BreakerScope `json:"scope"`
	Key   string       `json:"key"`
	// TaskID is the task whose review item holds the latch.
	TaskID string `json:"task_id"`
	// OpenedAt is when the item opened (the hallucination's decision time).
	OpenedAt Timestamp `json:"opened_at"`
	// Instance is the router instance that opened it.
	Instance string `json:"instance"`
}

// BreakerItemPrefix begins the key of every BreakerItem record: no breaker
// state's key ("<SCOPE>/<key>", an upper-case scope) begins with it.
const BreakerItemPrefix = "item/"

// BreakerResetPrefix begins the key of every RESET record on the breakers
// topic: a person's reset of a breaker, a BreakerState with State CLOSED and
// Reset true, keyed BreakerResetKey. Compaction keeps a breaker's last one.
const BreakerResetPrefix = "reset/"

// BreakerResetKey is the record key of a breaker's RESET:
// "reset/<scope>/<key>".
func BreakerResetKey(scope BreakerScope, key string) string {
	return BreakerResetPrefix + string(scope) + "/" + key
}

// ParseBreakerKey splits a breaker state's key, or a RESET's (prefix
// removed), into its scope and key.
func ParseBreakerKey(k string) (scope BreakerScope, key string, ok bool) {
	i := strings.IndexByte(k, '/')
	if i <= 0 || i == len(k)-1 {
		return "", "", false
	}
	return BreakerScope(k[:i]), k[i+1:], true
}

// BreakerLatchTask is the task ID of the item a person's latch by hand
// writes (`faultrouter breaker latch`): no worker's task, so no reviewer's
// decision ends it; a RESET does.
func BreakerLatchTask(operator string, at Timestamp) string {
	return fmt.Sprintf("latch:%s:%d", operator, at.UnixMilli())
}

// BreakerItemKey is the record key of a BreakerItem:
// "item/<scope>/<task_id>/<key>".
func BreakerItemKey(scope BreakerScope, key, taskID string) string {
	return BreakerItemPrefix + string(scope) + "/" + taskID + "/" + key
}

// AppendBreakerItemKey appends BreakerItemKey(scope, key, taskID) to dst.
func AppendBreakerItemKey(dst []byte, scope BreakerScope, key, taskID string) []byte {
	dst = append(append(dst, BreakerItemPrefix...), scope...)
	dst = append(append(append(dst, '/'), taskID...), '/')
	return append(dst, key...)
}

// Validate checks the fields a BreakerItem must have.
func (it *BreakerItem) Validate() error {
	switch {
	case it.Scope == "":
		return &FieldError{Field: "scope", Msg: "required, a non-empty string"}
	case it.Key == "":
		return &FieldError{Field: "key", Msg: "required, a non-empty string"}
	case it.TaskID == "":
		return &FieldError{Field: "task_id", Msg: "required, a non-empty string"}
	case it.OpenedAt.IsZero():
		return &FieldError{Field: "opened_at", Msg: "required, an RFC 3339 time or integer milliseconds"}
	}
	return nil
}

// EncodeBreakerItem encodes it as JSON.
func EncodeBreakerItem(it *BreakerItem) ([]byte, error) {
	if err := it.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(it)
}

// DecodeBreakerItem decodes and validates one BreakerItem; unknown fields
// are ignored.
func DecodeBreakerItem(b []byte) (BreakerItem, error) {
	var it BreakerItem
	if err := json.Unmarshal(b, &it); err != nil {
		return it, fmt.Errorf("breaker item: %w", err)
	}
	if err := it.Validate(); err != nil {
		return it, fmt.Errorf("breaker item: %w", err)
	}
	return it, nil
}
