package event

import (
	"bytes"
	"encoding/json"
)

// MarshalJSON flattens the event's fields next to "decision" and "input", so
// that a routed record reads as a TaskEvent with a decision.
func (r Routed) MarshalJSON() ([]byte, error) {
	type extra struct {
		Decision Decision `json:"decision"`
		Input    Source   `json:"input"`
	}
	tail, err := json.Marshal(extra{r.Decision, r.Input})
	if err != nil {
		return nil, err
	}
	if r.Event == nil {
		return tail, nil
	}
	head, err := json.Marshal(r.Event)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.Grow(len(head) + len(tail))
	buf.Write(head[:len(head)-1])
	buf.WriteByte(',')
	buf.Write(tail[1:])
	return buf.Bytes(), nil
}

// UnmarshalJSON reads the flattened form written by MarshalJSON.
func (r *Routed) UnmarshalJSON(b []byte) error {
	var probe struct {
		Decision Decision        `json:"decision"`
		Input    Source          `json:"input"`
		TaskID   json.RawMessage `json:"task_id"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return err
	}
	r.Decision, r.Input, r.Event = probe.Decision, probe.Input, nil
	if probe.TaskID == nil {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	delete(m, "decision")
	delete(m, "input")
	rest, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var e TaskEvent
	if err := json.Unmarshal(rest, &e); err != nil {
		return err
	}
	r.Event = &e
	return nil
}
