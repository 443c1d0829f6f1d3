package router

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// newRegistryRouter starts a test router reading through (and, with
// confluent, writing for) a fake registry. srfake is for unit tests only:
// its compatibility check always says yes.
func newRegistryRouter(t *testing.T, fake *srfake.Registry, wire registry.WireFormat) (*prometheus.Registry, Topics, []kgo.Opt, *codec.Codec) {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.New(registry.Config{URL: fake.URL(), Timeout: time.Second}, c)
	if err != nil {
		t.Fatal(err)
	}
	m, topics, seeds := newTestRouterWith(t, func(cfg *Config) { cfg.Registry, cfg.WireFormat = reg, wire })
	return m, topics, seeds, c
}

func okEvent(task string) event.TaskEvent {
	valid, conf := true, 0.95
	return event.TaskEvent{EventID: task + "-e", TaskID: task, Attempt: 1, OccurredAt: event.At(time.Now()),
		Source: "unit", Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "done", SchemaValid: &valid, Confidence: &conf}}
}

// confluentEvent is e in the Confluent wire format with schema ID id.
func confluentEvent(t *testing.T, c *codec.Codec, e event.TaskEvent, id uint32) []byte {
	t.Helper()
	so, err := c.EncodeTaskEvent(nil, &e)
	if err != nil {
		t.Fatal(err)
	}
	return codec.ToConfluent(so, id)
}

// Guards reading and writing the Confluent wire format on kfake: a record
// framed with a registered ID and one in the single-object encoding, to the
// same router, are both routed, and their audit records are written in
// the Confluent format with the ID of the audit subject; a record with an ID
// the registry does not know goes to the dead-letter topic as it came, with
// the error kind unknown_schema.
func TestConfluentOnKfake(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	cur, _ := avro.Current(avro.TaskEvent)
	fake.SeedSchema("ingress-value", 1, 7, sr.Schema{Schema: cur.JSON})
	_, topics, seeds, c := newRegistryRouter(t, fake, registry.Confluent)
	unknown := confluentEvent(t, c, okEvent("t-unknown"), 99)
	single, err := c.EncodeTaskEvent(nil, ptr(okEvent("t-single")))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testClient(t, seeds, topics.Ingress, topics.Audit, topics.DeadLetter)
	if err := cl.ProduceSync(ctx,
		&kgo.Record{Key: []byte("t-ok"), Value: confluentEvent(t, c, okEvent("t-ok"), 7)},
		&kgo.Record{Key: []byte("t-unknown"), Value: unknown},
		&kgo.Record{Key: []byte("t-single"), Value: single}, // the other framing, to the same router
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	audit, dead := collectAuditAndDead(ctx, t, cl, topics.Audit, 3, 1)
	ss, _ := fake.GetSchema(registry.Subject(topics.Audit), 1)
	auditID := ss.ID
	routed := map[string]bool{} // succeeded, by task
	for _, a := range audit {
		id, ok := codec.ConfluentID(a.Value)
		if !ok || int(id) != auditID {
			t.Fatalf("audit record starts % x, want 00 and the audit subject's ID %d", a.Value[:5], auditID)
		}
		r, err := c.WithSchemas(mustClient(t, fake, c)).DecodeRouted(a.Value)
		if err != nil {
			t.Fatalf("audit record: %v", err)
		}
		if r.Event != nil && r.Decision.Class == event.ClassSucceeded {
			routed[r.Event.TaskID] = true
		}
	}
	if !routed["t-ok"] || !routed["t-single"] {
		t.Fatalf("audited %v, want the Confluent-framed t-ok and the single-object t-single", routed)
	}
	if !bytes.Equal(dead[0].Value, unknown) || header(dead[0], codec.HeaderErrorKind) != "unknown_schema" {
		t.Fatalf("dead letter of the unknown ID: kind %q, original bytes %v", header(dead[0], codec.HeaderErrorKind), bytes.Equal(dead[0].Value, unknown))
	}
}

// Guards a registry outage on kfake: while the registry answers 503, a
// record whose ID is not cached is neither routed nor dead-lettered, the
// router is not ready and faultrouter_registry_waiting is 1; when the
// registry answers again the record is routed, an alert of scope REGISTRY
// says how long routing waited, and the router is ready.
func TestRegistryDownOnKfake(t *testing.T) {
	fake := srfake.New()
	defer fake.Close()
	cur, _ := avro.Current(avro.TaskEvent)
	fake.SeedSchema("ingress-value", 1, 7, sr.Schema{Schema: cur.JSON})
	fake.Intercept(func(w http.ResponseWriter, _ *http.Request) bool {
		http.Error(w, `{"error_code":50301,"message":"down"}`, http.StatusServiceUnavailable)
		return true
	})
	c, _ := codec.New()
	reg, _ := registry.New(registry.Config{URL: fake.URL(), Timeout: time.Second}, c)
	m, topics, seeds := newTestRouterWith(t, func(cfg *Config) { cfg.Registry = reg })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testClient(t, seeds, topics.Ingress, topics.Audit, topics.DeadLetter, topics.Alerts)
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte("t-wait"), Value: confluentEvent(t, c, okEvent("t-wait"), 7)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if v := gaugeValue(t, m, "faultrouter_registry_waiting"); v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("faultrouter_registry_waiting never became 1")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := gaugeValue(t, m, "faultrouter_ready"); v != 0 {
		t.Fatal("ready while waiting for the registry")
	}
	pollCtx, pollCancel := context.WithTimeout(ctx, time.Second)
	if n := cl.PollFetches(pollCtx).NumRecords(); n != 0 {
		t.Fatalf("%d records routed or dead-lettered while the registry was down", n)
	}
	pollCancel()

	fake.ClearInterceptors()
	got := map[string][]*kgo.Record{}
	for len(got[topics.Audit]) == 0 || len(got[topics.Alerts]) == 0 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("after the registry returned: %v, want an audit record and an alert", got)
		}
		fetches.EachRecord(func(r *kgo.Record) { got[r.Topic] = append(got[r.Topic], r) })
	}
	if len(got[topics.DeadLetter]) != 0 || len(got[topics.Audit]) != 1 {
		t.Fatalf("after the registry returned: %v, want one audit record and nothing dead-lettered", got)
	}
	alert, err := c.DecodeBreakerEvent(got[topics.Alerts][0].Value)
	if err != nil || alert.Scope != breaker.ScopeRegistry || alert.Kind != event.BreakerKindAlert || !strings.Contains(alert.Reason, "did not answer") {
		t.Fatalf("alert: %v %+v", err, alert)
	}
	for time.Now().Before(deadline) {
		if v := gaugeValue(t, m, "faultrouter_ready"); v == 1 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("not ready after the registry returned")
}

func mustClient(t *testing.T, fake *srfake.Registry, c *codec.Codec) *registry.Client {
	t.Helper()
	reg, err := registry.New(registry.Config{URL: fake.URL()}, c)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// gaugeValue is the value of the unlabelled gauge name in reg (0 if absent).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}
