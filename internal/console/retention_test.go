package console

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// Guards the view's retention by age: over months the view holds what is
// younger than --view-retention and every open review item, not every item,
// alert and dead letter ever read. Items decided 40 days ago, alerts and
// dead-letter copies of 40 days ago, and a decision for a task that never
// had an item, are deleted (with their index entries) on a quiet cluster;
// an item opened 40 days ago and still open stays in the queue, and what is
// a minute old stays. A retention under a minute is refused, naming the
// flag.
func TestViewRetentionByAge(t *testing.T) {
	opts, set := testCluster(t)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, _ := codec.New()
	name := func(short topicspec.Short) string { n, _ := set.Name(short); return n }
	old, recent := time.Now().Add(-40*24*time.Hour), time.Now()
	routed := func(topic topicspec.Short, task string, route event.Route, rule string, at time.Time) *kgo.Record {
		d := event.Decision{Class: event.ClassModelRefusal, Route: route, Rule: rule, Reason: "r", DecidedAt: event.At(at)}
		if route == event.RouteReview {
			d.Review = &event.Review{Owner: "ai_product", SLAMs: 60_000}
		}
		v, err := c.EncodeRouted(nil, &event.Routed{Event: &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1,
			OccurredAt: event.At(at), Source: "test", Action: "refund", Status: event.StatusError}, Decision: d})
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: name(topic), Key: []byte(task), Value: v, Timestamp: at}
	}
	decision := func(task string, at time.Time) *kgo.Record {
		v, err := c.EncodeReviewDecision(nil, &event.ReviewDecision{TaskID: task, Approve: false, Reason: "no", Reviewer: "ana", At: event.At(at)})
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: name("decisions"), Key: []byte(task), Value: v, Timestamp: at}
	}
	alert := func(task string, at time.Time) *kgo.Record {
		v, err := c.EncodeBreakerEvent(nil, &event.BreakerEvent{Scope: "TASK", Key: task, Kind: "ALERT", TaskID: task, Reason: "x", Instance: "a", At: event.At(at)})
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: name("alerts"), Key: []byte(task), Value: v, Timestamp: at}
	}
	dead := func(key string, at time.Time) *kgo.Record {
		return &kgo.Record{Topic: name("deadletter"), Key: []byte(key), Value: []byte("raw"), Timestamp: at, Headers: []kgo.RecordHeader{
			{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte("k")}}}
	}
	var recs []*kgo.Record
	for _, x := range []struct {
		task string
		at   time.Time
	}{{"old-decided", old}, {"new-decided", recent}} {
		recs = append(recs, routed("review", x.task, event.RouteReview, "model_refusal.review", x.at), decision(x.task, x.at.Add(time.Second)),
			routed("audit", x.task, event.RouteComplete, "MANUAL_REJECTED", x.at.Add(2*time.Second)))
	}
	recs = append(recs, routed("review", "old-open", event.RouteReview, "model_refusal.review", old),
		decision("old-orphan", old), decision("new-orphan", recent),
		alert("old-alert", old), alert("new-alert", recent), dead("old-dl", old), dead("new-dl", recent))
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	_, s := startConsole(t, opts, set, Config{Users: testUsers(t), ViewRetention: time.Minute})
	has := func(prefix, sub string) bool {
		found := false
		s.view.each(prefix, false, func(k string, _ []byte) bool {
			found = found || strings.Contains(k, sub)
			return !found
		})
		return found
	}
	count := func(prefix string) int {
		n := 0
		s.view.each(prefix, false, func(string, []byte) bool { n++; return true })
		return n
	}
	// the view reads every record, then prunes what is past the retention
	// (every 6 s: a tenth of it), on a cluster with no traffic
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && !(has("rev/", "new-orphan") && count("dl/") == 1 && !has("rev/", "old-decided")) {
		time.Sleep(200 * time.Millisecond)
	}
	for _, c := range []struct {
		prefix, sub string
		want        bool
	}{
		{"rev/", "old-decided", false}, {"cls/", "old-decided", false},
		{"rev/", "old-orphan", false}, {"orp/", "old-orphan", false},
		{"rev/", "old-open", true}, {"open/", "old-open", true},
		{"rev/", "new-decided", true}, {"cls/", "new-decided", true},
		{"rev/", "new-orphan", true}, {"orp/", "new-orphan", true},
	} {
		if got := has(c.prefix, c.sub); got != c.want {
			t.Errorf("%s%s in the view: %v, want %v", c.prefix, c.sub, got, c.want)
		}
	}
	if alerts, dls, dlis := count("alr/"), count("dl/"), count("dli/"); alerts != 1 || dls != 1 || dlis != 1 {
		t.Errorf("alerts %d, dead letters %d (index %d) in the view; want the recent one of each", alerts, dls, dlis)
	}

	bad := Config{Listen: ":0", StateDir: t.TempDir(), Kafka: opts, Topics: set, Users: testUsers(t), ViewRetention: 30 * time.Second}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "--view-retention") {
		t.Errorf("a retention of 30s: %v, want an error naming --view-retention", err)
	}
}
