package event

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// TaskEvent is one attempt outcome reported by a worker to the ingress topic,
// keyed by TaskID.
type TaskEvent struct {
	// EventID is unique per emission; a redelivered copy carries the same value.
	EventID string `json:"event_id"`
	// TaskID is the business task identity and the Kafka key.
	TaskID string `json:"task_id"`
	// Attempt is the worker's attempt number, 1-based.
	Attempt int32 `json:"attempt"`
	// OccurredAt is when the attempt ended.
	OccurredAt Timestamp `json:"occurred_at"`
	// Source is the emitting service.
	Source string `json:"source"`
	// Action is the business action, e.g. refund or contract_review.
	Action string `json:"action"`
	// Provider, Model and PromptTemplate name who answered; empty when unknown.
	Provider       string `json:"provider,omitempty"`
	Model          string `json:"model,omitempty"`
	PromptTemplate string `json:"prompt_template,omitempty"`
	// Stage is the layer where the outcome happened; empty when unknown.
	Stage Stage `json:"stage,omitempty"`
	// Status is OK or ERROR.
	Status Status `json:"status"`
	// Error describes a failed attempt.
	Error *Error `json:"error,omitempty"`
	// Output holds the model output checks.
	Output *Output `json:"output,omitempty"`
	// Usage is the cost of this attempt; the router sums it per task.
	Usage Usage `json:"usage"`
	// Operation is the business operation the attempt serves.
	Operation *Operation `json:"operation,omitempty"`
	// InputRef points at the input snapshot for reviewers.
	InputRef *InputRef `json:"input_ref,omitempty"`
	// SLAMs is the task's SLA in milliseconds; state lives 2 x SLA.
	SLAMs *int64 `json:"sla_ms,omitempty"`
	// Attributes holds anything else.
	Attributes map[string]string `json:"attributes,omitempty"`
}

// Error describes why an attempt failed.
type Error struct {
	Type         string `json:"type,omitempty"`
	HTTPStatus   int32  `json:"http_status,omitempty"`
	Code         string `json:"code,omitempty"`
	Message      string `json:"message,omitempty"`
	RetryAfterMs *int64 `json:"retry_after_ms,omitempty"`
}

// Output is what the worker's checks found in the model output.
type Output struct {
	Text        string   `json:"text,omitempty"`
	SchemaValid *bool    `json:"schema_valid,omitempty"`
	Confidence  *float64 `json:"confidence,omitempty"`
	Flags       []string `json:"flags,omitempty"`
}

// Usage is the cost of one attempt.
type Usage struct {
	CostUSD   float64 `json:"cost_usd"`
	Tokens    int64   `json:"tokens"`
	ElapsedMs int64   `json:"elapsed_ms"`
}

// Operation is the business operation an attempt serves.
type Operation struct {
	OpID         string  `json:"op_id"`
	Kind         OpKind  `json:"kind"`
	ParamsSHA256 string  `json:"params_sha256,omitempty"`
	State        OpState `json:"state"`
}

// InputRef points at the input snapshot of a task.
type InputRef struct {
	URI       string `json:"uri"`
	SHA256    string `json:"sha256,omitempty"`
	SizeBytes int64  `json:"size_bytes,omitempty"`
}

// MaxIDBytes bounds the identity fields of a TaskEvent: event_id, task_id,
// source, action, provider, model, prompt_template, error.type, error.code,
// operation.op_id and operation.params_sha256. They are keys, breaker names
// and state; an event with a longer one is invalid input (dead letter, kind
// invalid_record), so that the router's records and state stay bounded.
const MaxIDBytes = 1024

// FieldError names the JSON field that made a record invalid.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return "field " + e.Field + ": " + e.Msg }

// Validate checks the fields a TaskEvent must have and the enum values.
// The returned error is a *FieldError naming the first bad field.
func (e *TaskEvent) Validate() error {
	bad := func(f, msg string) error { return &FieldError{Field: f, Msg: msg} }
	switch {
	case e.EventID == "":
		return bad("event_id", "required, a non-empty string")
	case e.TaskID == "":
		return bad("task_id", "required, a non-empty string")
	case e.Attempt < 1:
		return bad("attempt", "required, an integer >= 1")
	case e.OccurredAt.IsZero():
		return bad("occurred_at", "required, an RFC 3339 time or integer milliseconds")
	case !oneOf(e.Status, Statuses):
		return bad("status", "must be OK or ERROR")
	case e.Stage != "" && !oneOf(e.Stage, Stages):
		return bad("stage", "must be NETWORK, PROTOCOL, MODEL, BUSINESS or null")
	case e.Usage.CostUSD < 0 || e.Usage.Tokens < 0 || e.Usage.ElapsedMs < 0:
		return bad("usage", "cost_usd, tokens and elapsed_ms must not be negative")
	case e.SLAMs != nil && *e.SLAMs <= 0:
		return bad("sla_ms", "must be a positive number of milliseconds or null")
	}
	if f := e.longID(); f != "" {
		return bad(f, fmt.Sprintf("longer than %d bytes", MaxIDBytes))
	}
	if op := e.Operation; op != nil {
		switch {
		case op.OpID == "":
			return bad("operation.op_id", "required when operation is set")
		case !oneOf(op.Kind, OpKinds):
			return bad("operation.kind", "must be GENERATE or WRITE")
		case !oneOf(op.State, OpStates):
			return bad("operation.state", "must be PLANNED, SUBMITTED, CONFIRMED, REJECTED or UNKNOWN")
		}
	}
	if e.InputRef != nil && e.InputRef.URI == "" {
		return bad("input_ref.uri", "required when input_ref is set")
	}
	return nil
}

// longID returns the JSON name of the first identity field over
// MaxIDBytes, "" when none is.
func (e *TaskEvent) longID() string {
	type field struct{ name, v string }
	var room [11]field // on the stack: every event is checked
	ids := append(room[:0], field{"event_id", e.EventID}, field{"task_id", e.TaskID}, field{"source", e.Source}, field{"action", e.Action},
		field{"provider", e.Provider}, field{"model", e.Model}, field{"prompt_template", e.PromptTemplate})
	if e.Error != nil {
		ids = append(ids, field{"error.type", e.Error.Type}, field{"error.code", e.Error.Code})
	}
	if e.Operation != nil {
		ids = append(ids, field{"operation.op_id", e.Operation.OpID}, field{"operation.params_sha256", e.Operation.ParamsSHA256})
	}
	for _, id := range ids {
		if len(id.v) > MaxIDBytes {
			return id.name
		}
	}
	return ""
}

// ParseTaskEventJSON decodes one JSON object strictly: an unknown field is an
// error naming it, and the result is validated.
func ParseTaskEventJSON(b []byte) (TaskEvent, error) {
	var e TaskEvent
	if err := strictUnmarshal(b, &e); err != nil {
		return e, err
	}
	return e, e.Validate()
}

// strictUnmarshal decodes one JSON value into v, rejecting unknown fields and
// trailing data, and rewrites encoding/json's messages to name the field.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonFieldError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func jsonFieldError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &FieldError{Field: te.Field, Msg: "want " + te.Type.String() + ", got JSON " + te.Value}
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return &FieldError{Field: strings.Trim(rest, `"`), Msg: "unknown field"}
	}
	if i := strings.Index(msg, "parsing time"); i >= 0 || strings.Contains(msg, "RFC 3339") {
		return &FieldError{Field: "occurred_at", Msg: msg}
	}
	return fmt.Errorf("invalid JSON: %w", err)
}
