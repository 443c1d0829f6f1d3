package router

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the trace context: a traceparent header on an input record is
// carried to every record routed from it (audit, review, a retry published at
// once and one published later when due), and no other input header leaks
// onto them.
func TestTraceparentCarriedToRoutedRecords(t *testing.T) {
	_, topics, seeds := newTestRouter(t)
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	at := event.At(time.Now())
	refusal := event.TaskEvent{EventID: "r-1", TaskID: "t-refuse", Attempt: 1, OccurredAt: at, Source: "unit",
		Action: "answer_ticket", Stage: event.StageModel, Status: event.StatusOK,
		Output: &event.Output{Text: "I cannot help with that."}}
	auth := event.TaskEvent{EventID: "a-1", TaskID: "t-auth", Attempt: 1, OccurredAt: at, Source: "unit",
		Action: "answer_ticket", Stage: event.StageProtocol, Status: event.StatusError,
		Error: &event.Error{Type: "AuthError", HTTPStatus: 401, Code: "token_expired"}}
	timeout := event.TaskEvent{EventID: "n-1", TaskID: "t-net", Attempt: 1, OccurredAt: at, Source: "unit",
		Action: "answer_ticket", Stage: event.StageNetwork, Status: event.StatusError,
		Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}}
	const (
		tpNet    = "00-11111111111111111111111111111111-2222222222222222-01"
		tpRefuse = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		tpAuth   = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	)
	var recs []*kgo.Record
	for _, x := range []struct {
		ev *event.TaskEvent
		tp string
	}{{&refusal, tpRefuse}, {&auth, tpAuth}, {&timeout, tpNet}} {
		v, err := c.EncodeTaskEvent(nil, x.ev)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: topics.Ingress, Key: []byte(x.ev.TaskID), Value: v,
			Headers: []kgo.RecordHeader{{Key: codec.HeaderTraceparent, Value: []byte(x.tp)}, {Key: "x-internal", Value: []byte("secret")}}})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := testClient(t, seeds, topics.Ingress, topics.Audit, topics.Review, topics.Retry)
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// want: 3 audit, 1 review (refusal), 2 retries (auth refresh at once; the
	// timeout's a second later, from the due index)
	got := map[string][]*kgo.Record{}
	for len(got[topics.Audit]) < 3 || len(got[topics.Review]) < 1 || len(got[topics.Retry]) < 2 {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("timed out; got %d audit, %d review, %d retry", len(got[topics.Audit]), len(got[topics.Review]), len(got[topics.Retry]))
		}
		fetches.EachRecord(func(r *kgo.Record) { got[r.Topic] = append(got[r.Topic], r) })
	}
	want := map[string]string{"t-refuse": tpRefuse, "t-auth": tpAuth, "t-net": tpNet}
	for topic, rs := range got {
		for _, r := range rs {
			var tp string
			for _, h := range r.Headers {
				switch h.Key {
				case codec.HeaderTraceparent:
					tp = string(h.Value)
				case "x-internal":
					t.Errorf("%s record of %s carries the input's x-internal header", topic, r.Key)
				}
			}
			if tp != want[string(r.Key)] {
				t.Errorf("%s record of %s: traceparent %q, want %q", topic, r.Key, tp, want[string(r.Key)])
			}
		}
	}
}
