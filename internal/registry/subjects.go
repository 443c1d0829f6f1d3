package registry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/pkg/codec"
)

// TopicSchema is a topic and the schema of its record values.
type TopicSchema struct {
	Topic  string
	Schema string // Avro schema text
}

// IncompatibleError is returned when the registry refuses a schema as
// incompatible with a subject's registered versions.
type IncompatibleError struct {
	Subject string
	// Field is the field that breaks compatibility with the subject's
	// latest version, as the Avro rules of schema resolution find it; ""
	// when they find none (the subject's level may compare with other
	// versions than the latest).
	Field string
	// Reason says why, in faultrouter's words or the registry's.
	Reason string
}

func (e *IncompatibleError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("subject %s: field %s breaks compatibility: %s", e.Subject, e.Field, e.Reason)
	}
	return fmt.Sprintf("subject %s: incompatible: %s", e.Subject, e.Reason)
}

// Register registers the schema under the topic's subject and returns its
// ID; a schema already registered there keeps its ID. A schema the registry
// refuses as incompatible is an *IncompatibleError.
func (r *Client) Register(ctx context.Context, topic, schema string) (int, error) {
	subject := Subject(topic)
	id, err := r.cl.RegisterSchema(ctx, subject, sr.Schema{Schema: schema, Type: sr.TypeAvro}, -1, -1)
	if err == nil {
		return id, nil
	}
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusConflict {
		return 0, r.explain(ctx, subject, schema, re.Message)
	}
	return 0, r.failed(subject, err)
}

// Lookup returns the ID of the schema under the topic's subject, which
// must be registered already.
func (r *Client) Lookup(ctx context.Context, topic, schema string) (int, error) {
	subject := Subject(topic)
	ss, err := r.cl.LookupSchema(ctx, subject, sr.Schema{Schema: schema, Type: sr.TypeAvro})
	if notFound(err) {
		return 0, fmt.Errorf("registry: subject %s: the schema is not registered (faultrouter schemas register registers it)", subject)
	}
	if err != nil {
		return 0, r.failed(subject, err)
	}
	return ss.ID, nil
}

// Check checks the schema for compatibility with the topic's subject, by
// the subject's compatibility level, without registering it: nil when the
// registry would accept it (a subject without versions accepts anything),
// an *IncompatibleError naming the field when it would not.
func (r *Client) Check(ctx context.Context, topic, schema string) error {
	subject := Subject(topic)
	res, err := r.cl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), subject, -1, sr.Schema{Schema: schema, Type: sr.TypeAvro})
	if notFound(err) {
		return nil
	}
	if err != nil {
		return r.failed(subject, err)
	}
	if res.Is {
		return nil
	}
	return r.explain(ctx, subject, schema, strings.Join(res.Messages, "; "))
}

// explain builds the IncompatibleError of a refused schema: the field the
// Avro resolution rules find in either direction between the subject's
// latest version and the schema, else the registry's message.
func (r *Client) explain(ctx context.Context, subject, schema, registryMsg string) error {
	e := &IncompatibleError{Subject: subject, Reason: registryMsg}
	if e.Reason == "" {
		e.Reason = "the registry refuses it under the subject's compatibility level"
	}
	latest, err := r.cl.SchemaByVersion(ctx, subject, -1)
	if err != nil {
		return e
	}
	for _, dir := range []struct{ w, rd, who string }{
		{latest.Schema.Schema, schema, "the new schema cannot read records of the registered one"},
		{schema, latest.Schema.Schema, "the registered schema cannot read records of the new one"},
	} {
		err := codec.CheckResolves(dir.w, dir.rd)
		var me *codec.SchemaMismatchError
		if errors.As(err, &me) {
			e.Field, e.Reason = me.Path, dir.who+" (version "+fmt.Sprint(latest.Version)+"): "+me.Msg
			return e
		}
	}
	return e
}

// failed wraps a request error: a registry that does not answer, answers
// with a server error or refuses the credentials is ErrUnavailable.
func (r *Client) failed(subject string, err error) error {
	var re *sr.ResponseError
	if errors.As(err, &re) && re.StatusCode < 500 && re.StatusCode != http.StatusUnauthorized && re.StatusCode != http.StatusForbidden {
		return fmt.Errorf("registry: subject %s: %w", subject, err)
	}
	return fmt.Errorf("%w: subject %s: %w", ErrUnavailable, subject, err)
}

// Framer rewrites faultrouter's single-object records into the Confluent
// wire format, with the IDs of their schemas under the topics' subjects. It
// is read-only once built and safe for concurrent use.
type Framer struct {
	ids map[string]map[uint64]uint32 // topic -> writer fingerprint -> ID
}

// Framer registers (register true) or looks up the schemas of the topics
// under their subjects and returns the Framer that writes them.
func (r *Client) Framer(ctx context.Context, topics []TopicSchema, register bool) (*Framer, error) {
	f := &Framer{ids: map[string]map[uint64]uint32{}}
	for _, ts := range topics {
		fp, err := avro.SchemaFingerprint(ts.Schema)
		if err != nil {
			return nil, fmt.Errorf("registry: topic %s: %w", ts.Topic, err)
		}
		var id int
		if register {
			id, err = r.Register(ctx, ts.Topic, ts.Schema)
		} else {
			id, err = r.Lookup(ctx, ts.Topic, ts.Schema)
		}
		if err != nil {
			return nil, err
		}
		if f.ids[ts.Topic] == nil {
			f.ids[ts.Topic] = map[uint64]uint32{}
		}
		f.ids[ts.Topic][fp] = uint32(id)
	}
	return f, nil
}

// Frame returns v, a single-object encoding written for topic, rewritten in
// place into the Confluent wire format; a value of a topic or schema the
// Framer was not built for is returned as it is. A nil Framer frames
// nothing.
func (f *Framer) Frame(topic string, v []byte) []byte {
	if f == nil {
		return v
	}
	fp, ok := codec.Fingerprint(v)
	if !ok {
		return v
	}
	id, ok := f.ids[topic][fp]
	if !ok {
		return v
	}
	return codec.ToConfluent(v, id)
}

// Schemas are the schemas faultrouter writes and reads per topic, for
// schemas register and check, and for the Framer of the router's outputs.
type Schemas struct {
	Ingress, Decisions, Retry, Review, Audit, DeadLetter, Alerts string // topic names
}

// TopicSchemas lists each topic with the current schema of its records:
// TaskEvent on ingress, ReviewDecision on decisions, RoutedRecord on retry,
// review, audit and dead letter, BreakerEvent on alerts.
func (s Schemas) TopicSchemas() ([]TopicSchema, error) {
	var out []TopicSchema
	for _, x := range []struct{ topic, name string }{
		{s.Ingress, avro.TaskEvent}, {s.Decisions, avro.ReviewDecision},
		{s.Retry, avro.RoutedRecord}, {s.Review, avro.RoutedRecord}, {s.Audit, avro.RoutedRecord},
		{s.DeadLetter, avro.RoutedRecord}, {s.Alerts, avro.BreakerEvent},
	} {
		if x.topic == "" {
			continue
		}
		cur, err := avro.Current(x.name)
		if err != nil {
			return nil, err
		}
		out = append(out, TopicSchema{Topic: x.topic, Schema: cur.JSON})
	}
	return out, nil
}

// SetCompatibility sets the compatibility level of the topic's subject,
// one of NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE,
// FULL, FULL_TRANSITIVE.
func (r *Client) SetCompatibility(ctx context.Context, topic, level string) error {
	var l sr.CompatibilityLevel
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return fmt.Errorf("registry: compatibility level %q is not one of NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL, FULL_TRANSITIVE", level)
	}
	subject := Subject(topic)
	for _, res := range r.cl.SetCompatibility(ctx, sr.SetCompatibility{Level: l}, subject) {
		if res.Err != nil {
			return r.failed(subject, res.Err)
		}
	}
	return nil
}

// Level returns the compatibility level that applies to the topic's
// subject: its own, or the registry's global level.
func (r *Client) Level(ctx context.Context, topic string) (string, error) {
	subject := Subject(topic)
	res := r.cl.Compatibility(sr.WithParams(ctx, sr.DefaultToGlobal), subject)
	if len(res) == 1 && notFound(res[0].Err) {
		res = r.cl.Compatibility(ctx)
	}
	if len(res) != 1 {
		return "", fmt.Errorf("registry: subject %s: no compatibility level in the answer", subject)
	}
	if res[0].Err != nil {
		return "", r.failed(subject, res[0].Err)
	}
	return res[0].Level.String(), nil
}
