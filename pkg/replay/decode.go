package replay

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Raw is the JSON form of a record that does not decode, or of a
// dead-lettered input record (original bytes plus the error headers).
type Raw struct {
	Error       string            `json:"error"`
	ErrorKind   string            `json:"error_kind"`
	Topic       string            `json:"topic"`
	Partition   int32             `json:"partition"`
	Offset      int64             `json:"offset"`
	Key         string            `json:"key"`
	Headers     map[string]string `json:"headers,omitempty"`
	ValueBase64 string            `json:"value_base64"`
}

// ErrorHeaders returns the record's faultrouter.error.* headers, nil without
// any.
func ErrorHeaders(rec *kgo.Record) map[string]string {
	var m map[string]string
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, "faultrouter.error.") {
			if m == nil {
				m = map[string]string{}
			}
			m[h.Key] = string(h.Value)
		}
	}
	return m
}

// IsPoison reports whether rec is a dead-lettered input record (its original
// bytes with error headers) rather than a routed record.
func IsPoison(rec *kgo.Record) bool {
	stage := ErrorHeaders(rec)["faultrouter.error.stage"]
	return stage != "" && stage != "route"
}

// Headers converts the record's headers.
func Headers(rec *kgo.Record) []Header {
	hs := make([]Header, len(rec.Headers))
	for i, h := range rec.Headers {
		hs[i] = Header{Key: h.Key, Value: h.Value}
	}
	return hs
}

// Decode turns one consumed record of the topic named short (ingress,
// audit, ...) into a step.
func Decode(c *codec.Codec, rec *kgo.Record, short string) Step {
	st := Step{Topic: rec.Topic, Short: short, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp, TaskID: string(rec.Key)}
	for _, h := range rec.Headers {
		if strings.HasPrefix(h.Key, HeaderPrefix) {
			if st.Lineage == nil {
				st.Lineage = map[string]string{}
			}
			st.Lineage[strings.TrimPrefix(h.Key, HeaderPrefix)] = string(h.Value)
		}
	}
	if IsPoison(rec) {
		hdr := ErrorHeaders(rec)
		st.Kind = KindPoison
		st.Summary = "dead-lettered input (" + hdr["faultrouter.error.stage"] + ")"
		st.Reason = hdr["faultrouter.error.kind"] + ": " + hdr["faultrouter.error.message"]
		st.Value = Raw{
			Error: hdr["faultrouter.error.message"], ErrorKind: hdr["faultrouter.error.kind"],
			Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key),
			Headers: hdr, ValueBase64: base64.StdEncoding.EncodeToString(rec.Value),
		}
		return st
	}
	v, err := c.Decode(rec.Value)
	if err != nil {
		st.Kind, st.Summary, st.Reason = KindUnusable, "undecodable record", err.Error()
		st.Value = Raw{Error: err.Error(), ErrorKind: codec.Kind(err), Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
			Key: string(rec.Key), ValueBase64: base64.StdEncoding.EncodeToString(rec.Value)}
		return st
	}
	st.Value = v
	switch x := v.(type) {
	case *event.TaskEvent:
		st.Kind, st.Event, st.TaskID = KindEvent, x, x.TaskID
		st.Summary = fmt.Sprintf("attempt %d %s", x.Attempt, x.Status)
		if x.Error != nil {
			st.Reason = strings.TrimSpace(fmt.Sprintf("%s %d %s %s", x.Error.Type, x.Error.HTTPStatus, x.Error.Code, x.Error.Message))
		}
		if n := RedriveCount(Headers(rec)); n > 0 {
			st.Summary += fmt.Sprintf(" (re-drive %d)", n)
		}
	case *event.Routed:
		st.Kind, st.Event, st.Decision = KindRouted, x.Event, &x.Decision
		if x.Event != nil {
			st.TaskID = x.Event.TaskID
			st.Summary = fmt.Sprintf("attempt %d ", x.Event.Attempt)
		}
		st.Summary += fmt.Sprintf("%s -> %s", x.Decision.Class, x.Decision.Route)
		if x.Decision.Retry != nil {
			st.Summary += fmt.Sprintf(" (retry %d, not before %s)", x.Decision.Retry.N, x.Decision.Retry.NotBefore.Format(time.RFC3339))
		}
		st.Reason = x.Decision.Reason
	case *event.BreakerEvent:
		st.Kind, st.TaskID = KindBreaker, x.TaskID
		st.Summary = strings.TrimSpace(fmt.Sprintf("%s %s %s %s", x.Kind, x.Scope, x.Key, strings.Trim(x.From+"->"+x.To, "->")))
		st.Reason = x.Reason
	case *event.ReviewDecision:
		st.Kind, st.TaskID = KindReview, x.TaskID
		st.Summary = "review reject by " + x.Reviewer
		if x.Approve {
			st.Summary = "review approve by " + x.Reviewer
		}
		st.Reason = x.Reason
	}
	return st
}
