package replay

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
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

// RawOf is the JSON form of a dead-lettered input record: its original
// bytes and its contract headers.
func RawOf(rec *kgo.Record, e *codec.ErrorInfo) Raw {
	return Raw{
		Error: e.Message, ErrorKind: e.Kind,
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key),
		Headers: codec.HeaderMap(rec.Headers), ValueBase64: base64.StdEncoding.EncodeToString(rec.Value),
	}
}

// Decode turns one consumed record of the topic named short (ingress,
// audit, ...) into a step.
func Decode(c *codec.Codec, rec *kgo.Record, short topicspec.Short) Step {
	st := Step{Topic: rec.Topic, Short: short, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp, TaskID: string(rec.Key)}
	for k, v := range codec.HeaderMap(rec.Headers) {
		if name, ok := strings.CutPrefix(k, codec.RedriveHeaderPrefix); ok {
			if st.Lineage == nil {
				st.Lineage = map[string]string{}
			}
			st.Lineage[name] = v
		}
	}
	hdr := codec.ParseHeaders(rec.Headers)
	if e := hdr.Error; e.Raw() {
		st.Kind = KindPoison
		st.Summary = "dead-lettered input (" + e.Stage + ")"
		st.Reason = e.Kind + ": " + e.Message
		st.Value = RawOf(rec, e)
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
		if r := hdr.Redrive; r != nil {
			st.Summary += fmt.Sprintf(" (re-drive %d)", r.Count)
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
		st.Summary = strings.TrimSpace(fmt.Sprintf("%s %s %s %s", x.Kind, x.Scope, x.Key, strings.Trim(string(x.From)+"->"+string(x.To), "->")))
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
