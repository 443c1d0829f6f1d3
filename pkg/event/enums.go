package event

import "fmt"

// Stage is the layer of the worker's pipeline where an outcome happened.
type Stage string

// Stages. The empty Stage means "not reported" (Avro null).
const (
	StageNetwork  Stage = "NETWORK"
	StageProtocol Stage = "PROTOCOL"
	StageModel    Stage = "MODEL"
	StageBusiness Stage = "BUSINESS"
)

// Stages lists every Stage value, in schema order.
var Stages = []Stage{StageNetwork, StageProtocol, StageModel, StageBusiness}

// Status is the outcome of one attempt.
type Status string

// Statuses.
const (
	StatusOK    Status = "OK"
	StatusError Status = "ERROR"
)

// Statuses lists every Status value, in schema order.
var Statuses = []Status{StatusOK, StatusError}

// OpKind tells a side-effect-free generation from a write to a business system.
type OpKind string

// Operation kinds.
const (
	OpGenerate OpKind = "GENERATE"
	OpWrite    OpKind = "WRITE"
)

// OpKinds lists every OpKind value, in schema order.
var OpKinds = []OpKind{OpGenerate, OpWrite}

// OpState is what the worker knows about a business operation.
type OpState string

// Operation states. UNKNOWN means the request was sent and no receipt came back.
const (
	OpPlanned   OpState = "PLANNED"
	OpSubmitted OpState = "SUBMITTED"
	OpConfirmed OpState = "CONFIRMED"
	OpRejected  OpState = "REJECTED"
	OpUnknown   OpState = "UNKNOWN"
)

// OpStates lists every OpState value, in schema order.
var OpStates = []OpState{OpPlanned, OpSubmitted, OpConfirmed, OpRejected, OpUnknown}

// Class is the failure class the policy assigns to an event.
type Class string

// Classes, as in docs/design.md. InvalidInput is the class of a record the router
// could not decode or accept (it never reaches the policy).
const (
	ClassSucceeded          Class = "SUCCEEDED"
	ClassNetworkTimeout     Class = "NETWORK_TIMEOUT"
	ClassAuthFailed         Class = "AUTH_FAILED"
	ClassInputQuality       Class = "INPUT_QUALITY_ISSUE"
	ClassModelRefusal       Class = "MODEL_REFUSAL"
	ClassSchemaViolation    Class = "SCHEMA_VIOLATION"
	ClassValidationFixable  Class = "VALIDATION_FIXABLE"
	ClassDuplicateExecution Class = "DUPLICATE_EXECUTION"
	ClassBusinessRejected   Class = "BUSINESS_REJECTED"
	ClassHallucination      Class = "MODEL_HALLUCINATION"
	ClassRateLimited        Class = "RATE_LIMITED"
	ClassRateLimitExceeded  Class = "RATE_LIMIT_EXCEEDED"
	ClassBudgetExhausted    Class = "BUDGET_EXHAUSTED"
	ClassOutcomeUnknown     Class = "OUTCOME_UNKNOWN"
	ClassParamsMismatch     Class = "PARAMS_MISMATCH"
	ClassUnclassified       Class = "UNCLASSIFIED"
	ClassInvalidInput       Class = "INVALID_INPUT"
)

// Classes lists every Class value, in schema order. Metrics use it as the
// fixed label set for "class".
var Classes = []Class{
	ClassSucceeded, ClassNetworkTimeout, ClassAuthFailed, ClassInputQuality,
	ClassModelRefusal, ClassSchemaViolation, ClassValidationFixable,
	ClassDuplicateExecution, ClassBusinessRejected, ClassHallucination,
	ClassRateLimited, ClassRateLimitExceeded, ClassBudgetExhausted,
	ClassOutcomeUnknown, ClassParamsMismatch, ClassUnclassified, ClassInvalidInput,
}

// Route is where the router sends an event.
type Route string

// Routes. DROP is an exact redelivery of an event already routed.
const (
	RouteRetry      Route = "RETRY"
	RouteReview     Route = "REVIEW"
	RouteDeadLetter Route = "DEADLETTER"
	RouteQuarantine Route = "QUARANTINE"
	RouteComplete   Route = "COMPLETE"
	RouteDrop       Route = "DROP"
)

// Routes lists every Route value, in schema order.
var Routes = []Route{RouteRetry, RouteReview, RouteDeadLetter, RouteQuarantine, RouteComplete, RouteDrop}

func (s Stage) String() string   { return string(s) }
func (s Status) String() string  { return string(s) }
func (k OpKind) String() string  { return string(k) }
func (s OpState) String() string { return string(s) }
func (c Class) String() string   { return string(c) }
func (r Route) String() string   { return string(r) }

// ParseClass returns the Class named s, or an error listing the allowed names.
func ParseClass(s string) (Class, error) {
	for _, c := range Classes {
		if string(c) == s {
			return c, nil
		}
	}
	return "", fmt.Errorf("event: unknown class %q (allowed: %v)", s, Classes)
}

// ParseRoute returns the Route named s, or an error listing the allowed names.
func ParseRoute(s string) (Route, error) {
	for _, r := range Routes {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("event: unknown route %q (allowed: %v)", s, Routes)
}

func oneOf[T ~string](v T, all []T) bool {
	for _, a := range all {
		if a == v {
			return true
		}
	}
	return false
}
