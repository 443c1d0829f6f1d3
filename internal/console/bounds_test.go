package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards the bounds of the pages, which a viewer (or a worker writing
// records) must not be able to blow up: the queue shows a page of items at a
// time (with each owner's full counts and a link to the next page), the dead
// letters 200 at a time; a dead letter's original bytes are not embedded in
// the page (a record of nearly 1 MB makes
// no 1 MB page) but served on demand as a download; a task's timeline reads
// from a time bound (7 days by default, wider on request).
func TestPagesAreBounded(t *testing.T) {
	base, opts, set := testConsole(t, Config{Users: testUsers(t)})
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, _ := codec.New()
	review, _ := set.Name("review")
	audit, _ := set.Name("audit")
	dl, _ := set.Name("deadletter")
	ctx := context.Background()
	var recs []*kgo.Record
	for i := 0; i < 230; i++ {
		task := fmt.Sprintf("bulk-%03d", i)
		v, err := c.EncodeRouted(nil, &event.Routed{
			Event: &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1, OccurredAt: event.At(time.Now()), Source: "test", Action: "refund", Status: event.StatusError},
			Decision: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteReview, Rule: "test", Reason: "refused",
				Review: &event.Review{Owner: "ai_product", SLAMs: 60_000}, DecidedAt: event.At(time.Now())}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: review, Key: []byte(task), Value: v})
	}
	for i := 0; i < 205; i++ {
		recs = append(recs, &kgo.Record{Topic: dl, Key: []byte(fmt.Sprintf("dl-%03d", i)), Value: []byte("raw"), Headers: []kgo.RecordHeader{
			{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte("k")}}})
	}
	big := strings.Repeat("<script>alert(1)</script>", 900<<10/25) // 900 KiB: within the broker's default record limit
	recs = append(recs, &kgo.Record{Topic: dl, Key: []byte("t-big"), Value: []byte(big), Headers: []kgo.RecordHeader{
		{Key: codec.HeaderErrorStage, Value: []byte(codec.StageDecode)}, {Key: codec.HeaderErrorKind, Value: []byte("too_big")}}})
	// t-1 has an audit record of 30 days ago and one of now
	old, _ := c.EncodeRouted(nil, &event.Routed{
		Event:    &event.TaskEvent{EventID: "e-old", TaskID: "t-1", Attempt: 1, OccurredAt: event.At(time.Now().Add(-30 * 24 * time.Hour)), Source: "test", Action: "refund", Status: event.StatusError},
		Decision: event.Decision{Class: event.ClassModelRefusal, Route: event.RouteDrop, Rule: "long-ago", Reason: "thirty days ago", DecidedAt: event.At(time.Now())}})
	recs = append(recs, &kgo.Record{Topic: audit, Key: []byte("t-1"), Value: old, Timestamp: time.Now().Add(-30 * 24 * time.Hour)})
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	alice := newClient(t, base)
	alice.login("alice")
	body := waitFor(t, alice, "/review", func(b string) bool { return strings.Contains(b, "Open 232") })
	if n := strings.Count(body, `<tr data-task=`); n > 100+20 { // a page of the queue, and the recently closed
		t.Errorf("the queue page shows %d rows, want at most a page of 100", n)
	}
	next := regexp.MustCompile(`id="next-page" href="([^"]+)"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatalf("no link to the next page of the queue")
	}
	_, body2 := alice.do(http.MethodGet, strings.ReplaceAll(next[1], "&amp;", "&"), nil)
	first := regexp.MustCompile(`data-task="([^"]+)"`).FindStringSubmatch(body)[1]
	if second := regexp.MustCompile(`data-task="([^"]+)"`).FindStringSubmatch(body2); second == nil || second[1] == first {
		t.Errorf("the next page starts at %v, want items after the first page's", second)
	}

	// 206 dead letters: a page of 200, then the next page with the rest
	dl1 := waitFor(t, alice, "/deadletter", func(b string) bool { return strings.Contains(b, `id="next-page"`) })
	if n := strings.Count(dl1, "<tr data-id="); n != 200 {
		t.Errorf("the first dead-letter page shows %d records, want 200", n)
	}
	nextDL := regexp.MustCompile(`id="next-page" href="([^"]+)"`).FindStringSubmatch(dl1)
	_, dl2 := alice.do(http.MethodGet, strings.ReplaceAll(nextDL[1], "&amp;", "&"), nil)
	if n := strings.Count(dl2, "<tr data-id="); n != 6 || strings.Contains(dl2, `id="next-page"`) {
		t.Errorf("the second dead-letter page shows %d records (want 6) or links to a third", n)
	}
	var bigRow string
	for _, page := range []string{dl1, dl2} {
		if len(page) > 256<<10 {
			t.Errorf("a dead-letter page is %d bytes with a 900 KiB record, want it bounded", len(page))
		}
		for _, row := range strings.Split(page, "<tr data-id=") {
			if strings.Contains(row, "t-big") {
				bigRow = row
			}
		}
	}
	raw := regexp.MustCompile(`href="(/deadletter/raw\?[^"]+)"`).FindStringSubmatch(bigRow)
	if raw == nil {
		t.Fatalf("no link to t-big's original bytes")
	}
	req, _ := http.NewRequest(http.MethodGet, base+strings.ReplaceAll(raw[1], "&amp;", "&"), nil)
	resp, err := alice.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != big || resp.Header.Get("Content-Type") != "application/octet-stream" || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") {
		t.Errorf("original bytes: %d bytes, %s, %s; want the 900 KiB as an attachment", len(got), resp.Header.Get("Content-Type"), resp.Header.Get("Content-Disposition"))
	}

	if _, body := alice.do(http.MethodGet, "/task?id=t-1", nil); strings.Contains(body, "thirty days ago") || !strings.Contains(body, `name="since"`) {
		t.Errorf("t-1's timeline by default shows the 30-day-old record, or offers no since")
	}
	if _, body := alice.do(http.MethodGet, "/task?id=t-1&since=-900h", nil); !strings.Contains(body, "thirty days ago") {
		t.Errorf("t-1's timeline since -900h lacks the 30-day-old record")
	}
}
