package console

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// workServer is a console with its view and no Kafka: the test fills the
// view through the ingest's own functions and renders pages from it.
func workServer(tb testing.TB) *Server {
	tb.Helper()
	set, err := topicspec.Load("")
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(Config{Listen: "127.0.0.1:0", StateDir: tb.TempDir(), Kafka: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}, Topics: set,
		Users: &Users{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.view.close() })
	return s
}

// fill applies n records to the view in batches of 10,000: add(b, i) writes
// the i-th.
func fill(t *testing.T, s *Server, n int, add func(b *batch, i int) error) {
	t.Helper()
	for i := 0; i < n; i += 10_000 {
		b := s.view.batch()
		for j := i; j < min(i+10_000, n); j++ {
			if err := add(b, j); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// render renders a page for p and returns its body and the view keys it read.
func render(t *testing.T, s *Server, p *person, url string, page func(http.ResponseWriter, *http.Request, *person) error) (string, int64) {
	t.Helper()
	before := s.view.reads.Load()
	w := httptest.NewRecorder()
	if err := page(w, httptest.NewRequest(http.MethodGet, url, nil), p); err != nil || w.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, w.Code, err)
	}
	reads := s.view.reads.Load() - before
	t.Logf("GET %s read %d view keys", url, reads)
	return w.Body.String(), reads
}

// skipShort skips a test of 100,000 records under -short: the race pass
// (make test) runs the package with it, where filling the view takes
// minutes and the work counted is the same.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("100,000 records: run without -short")
	}
}

// pageBound is the most view keys one page may read, whatever the view
// holds: its page of rows and what each row shows, and the counts kept.
const pageBound = 2_000

// Guards the work of the review queue, whatever a bad template rollout
// opens: 100,000 open hallucination items of one latched template, and
// 100,000 operator-log records today (sign-ins, and approvals by one
// reviewer). The page reads a bounded number of keys (its 100 rows, each
// row's latch note from a count kept as items open and close, the
// reviewers' table from a count kept per reviewer and day), and what it
// shows is exact: the owner's open count, the other items keeping the
// template offline, the approvals today. Its next page reads no more.
func TestReviewPageWorkIsBounded(t *testing.T) {
	skipShort(t)
	s := workServer(t)
	now := time.Now()
	const n = 100_000
	fill(t, s, 1, func(b *batch, _ int) error {
		return b.put("brk/"+breaker.PromptTemplate.String()+"/tpl-bad", breakerView{Scope: breaker.PromptTemplate.Name(), Key: "tpl-bad",
			State: breaker.Open.Name(), Latched: true, Since: now, OpenedAt: now})
	})
	fill(t, s, n, func(b *batch, i int) error {
		_, err := s.updateItem(b, fmt.Sprintf("h-%06d", i), func(it *reviewItem) {
			it.OpenedAt, it.SLAMs = now.Add(-time.Duration(i)*time.Millisecond), 259_200_000
			it.Owner, it.Class, it.Template, it.Reason = "ai_product", string(event.ClassHallucination), "tpl-bad", "fabricated_data"
		})
		return err
	})
	fill(t, s, n, func(b *batch, i int) error {
		a := opAction{Kind: "action", Action: "signin", User: fmt.Sprintf("u%d", i%50), At: now.Add(-time.Duration(i) * time.Millisecond)}
		if i%2 == 0 {
			a.Action, a.User, a.Tasks = "approve", "alice", []string{fmt.Sprintf("x-%d", i)}
		}
		v, _ := json.Marshal(a)
		_, err := s.applyAction(b, &kgo.Record{Value: v, Partition: 0, Offset: int64(i)})
		return err
	})
	p := &person{Name: "rita", Roles: []string{RoleReviewer}, Owners: []string{"*"}}
	body, reads := render(t, s, p, "/review", s.reviewPage)
	if reads > pageBound {
		t.Errorf("the first page of a queue of %d items read %d view keys, want at most %d", n, reads, pageBound)
	}
	if !strings.Contains(body, "<b>ai_product</b> Open 100000 · Overdue 0") {
		t.Errorf("the owner's counts are not on the page:\n%s", section(body, "owners"))
	}
	if got := regexp.MustCompile(`data-task="h-`).FindAllString(body, -1); len(got) != queuePage {
		t.Errorf("the page shows %d items, want %d", len(got), queuePage)
	}
	if !strings.Contains(body, "99999") || !strings.Contains(body, "tpl-bad") {
		t.Errorf("the latch note does not say that 99,999 other items keep tpl-bad offline")
	}
	if !regexp.MustCompile(`data-reviewer="alice"[^>]*><td>alice</td><td class="decided-today">50000<`).MatchString(body) {
		t.Errorf("the reviewers' table does not count alice's 50,000 approvals today:\n%s", section(body, "reviewer-progress"))
	}
	next := regexp.MustCompile(`id="next-page" href="/review\?after=([^"]+)"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatal("no next page")
	}
	if _, reads := render(t, s, p, "/review?after="+strings.ReplaceAll(next[1], "&amp;", "&"), s.reviewPage); reads > pageBound {
		t.Errorf("the second page read %d view keys, want at most %d", reads, pageBound)
	}
	// a decision arrives for one item: one fewer keeps the template offline
	fill(t, s, 1, func(b *batch, _ int) error {
		_, err := s.updateItem(b, "h-000000", func(it *reviewItem) {
			applyDecision(it, &event.ReviewDecision{TaskID: "h-000000", Approve: true, Reviewer: "alice", Reason: "ok", At: event.At(now)}, now)
		})
		return err
	})
	if body, _ := render(t, s, p, "/review", s.reviewPage); !strings.Contains(body, "99998") {
		t.Errorf("after one item was decided, the latch note does not count 99,998 others")
	}
}

// section returns the element of body with id (a few hundred bytes of it),
// for a failure message.
func section(body, id string) string {
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		i = strings.Index(body, `class="`+id+`"`)
	}
	if i < 0 {
		return "(not found)"
	}
	return body[i:min(len(body), i+600)]
}

// Guards the work of the Breakers page with 100,000 breakers (templates
// named by hostile or careless workers) and 100,000 retries held behind an
// open one: a page of 100, open ones first, each open breaker's held
// retries counted up to a bound, and a next page.
func TestBreakersPageWorkIsBounded(t *testing.T) {
	skipShort(t)
	s := workServer(t)
	now := time.Now()
	const n = 100_000
	transition := func(b *batch, key string, to event.BreakerStateName, at time.Time) error {
		v := &event.BreakerEvent{Scope: breaker.PromptTemplate.Name(), Key: key, Kind: "TRANSITION", From: breaker.Closed.Name(), To: to,
			Reason: "why", Instance: "a", At: event.At(at)}
		enc, err := s.codec.EncodeBreakerEvent(nil, v)
		if err != nil {
			return err
		}
		alerts, _ := s.cfg.Topics.Name("alerts")
		_, err = s.apply(b, &kgo.Record{Topic: alerts, Key: []byte(key), Value: enc, Timestamp: at}, "alerts")
		return err
	}
	fill(t, s, n, func(b *batch, i int) error {
		return transition(b, fmt.Sprintf("tpl-%06d", i), breaker.Closed.Name(), now)
	})
	fill(t, s, 1, func(b *batch, _ int) error { return transition(b, "tpl-050000", breaker.Open.Name(), now) })
	audit, _ := s.cfg.Topics.Name("audit")
	fill(t, s, n, func(b *batch, i int) error {
		task := fmt.Sprintf("r-%06d", i)
		r := &event.Routed{Event: &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1, OccurredAt: event.At(now), Source: "test",
			Action: "refund", PromptTemplate: "tpl-050000", Status: event.StatusError},
			Decision: event.Decision{Class: event.ClassNetworkTimeout, Route: event.RouteRetry, Rule: "t", Reason: "timeout",
				Retry: &event.RetryPlan{N: 1, NotBefore: event.At(now.Add(-time.Minute))}, DecidedAt: event.At(now)}}
		v, err := s.codec.EncodeRouted(nil, r)
		if err != nil {
			return err
		}
		_, err = s.apply(b, &kgo.Record{Topic: audit, Key: []byte(task), Value: v, Timestamp: now}, "audit")
		return err
	})
	p := &person{Name: "olga", Roles: []string{RoleOperator}}
	body, reads := render(t, s, p, "/breakers", s.breakersPage)
	if bound := int64(pageBound + maxHeldCount); reads > bound {
		t.Errorf("the Breakers page of %d breakers read %d view keys, want at most %d", n+1, reads, bound)
	}
	rows := regexp.MustCompile(`<tr data-breaker="([^"]+)"`).FindAllStringSubmatch(body, -1)
	if len(rows) != breakersPage || rows[0][1] != "PROMPT_TEMPLATE/tpl-050000" {
		t.Fatalf("the page shows %d breakers starting with %v, want %d with the open one first", len(rows), rows[0], breakersPage)
	}
	if !strings.Contains(body, fmt.Sprintf(`<td class="held">%d+</td>`, maxHeldCount)) {
		t.Errorf("the open breaker's held retries do not show as %d+", maxHeldCount)
	}
	next := regexp.MustCompile(`id="next-page" href="/breakers\?after=([^"]+)"`).FindStringSubmatch(body)
	if next == nil {
		t.Fatal("no next page of breakers")
	}
	body2, reads := render(t, s, p, "/breakers?after="+strings.ReplaceAll(next[1], "&amp;", "&"), s.breakersPage)
	if reads > pageBound {
		t.Errorf("the second page read %d view keys, want at most %d", reads, pageBound)
	}
	if rows2 := regexp.MustCompile(`<tr data-breaker="([^"]+)"`).FindAllStringSubmatch(body2, -1); len(rows2) != breakersPage || rows2[0][1] != "PROMPT_TEMPLATE/tpl-000099" {
		t.Errorf("the second page starts at %v after %v", rows2[0], rows[len(rows)-1])
	}
}

// Guards the work of the Cost page: 100,000 ledger keys of ten days ago
// (one per template and hour) are not read for the last 24 hours, and
// the view's retention prunes them.
func TestCostPageWorkIsBounded(t *testing.T) {
	skipShort(t)
	s := workServer(t)
	now := time.Now()
	old := now.Add(-10 * 24 * time.Hour)
	audit, _ := s.cfg.Topics.Name("audit")
	record := func(b *batch, task, tmpl string, at time.Time) error {
		r := &event.Routed{Event: &event.TaskEvent{EventID: "e-" + task, TaskID: task, Attempt: 1, OccurredAt: event.At(at), Source: "test",
			Action: "refund", Provider: "p", Model: "m", PromptTemplate: tmpl, Status: event.StatusOK, Usage: event.Usage{CostUSD: 0.25}},
			Decision: event.Decision{Class: event.ClassSucceeded, Route: event.RouteComplete, Rule: "t", Reason: "ok", DecidedAt: event.At(at)}}
		v, err := s.codec.EncodeRouted(nil, r)
		if err != nil {
			return err
		}
		_, err = s.apply(b, &kgo.Record{Topic: audit, Key: []byte(task), Value: v, Timestamp: at}, "audit")
		return err
	}
	fill(t, s, 100_000, func(b *batch, i int) error {
		return record(b, fmt.Sprintf("old-%06d", i), fmt.Sprintf("tpl-%06d", i), old.Add(time.Duration(i%48)*time.Hour))
	})
	fill(t, s, 4, func(b *batch, i int) error { return record(b, fmt.Sprintf("new-%d", i), "tpl-now", now) })
	p := &person{Name: "olga", Roles: []string{RoleOperator}}
	body, reads := render(t, s, p, "/cost?hours=24", s.costPage)
	if reads > pageBound {
		t.Errorf("the Cost page of the last 24 hours read %d view keys among 100,000 of ten days ago, want at most %d", reads, pageBound)
	}
	if !strings.Contains(body, "$1.00") {
		t.Errorf("the last 24 hours' spend ($1.00 of four attempts) is not on the page")
	}
	s.cfg.ViewRetention = 7 * 24 * time.Hour
	if _, err := s.prune(now); err != nil {
		t.Fatal(err)
	}
	left := 0
	if err := s.view.each("cost/", false, func(string, []byte) bool { left++; return true }); err != nil {
		t.Fatal(err)
	}
	if left != 3 { // the hour of now: its class, provider/model and template
		t.Errorf("after pruning with a 7-day retention %d cost keys are left, want the 3 of this hour", left)
	}
}

// Guards the queue's pager at the edge: a queue of exactly one page has no
// next page, one of a page and one item has.
func TestQueuePagerAtAPage(t *testing.T) {
	for _, n := range []int{queuePage, queuePage + 1} {
		s := workServer(t)
		now := time.Now()
		fill(t, s, n, func(b *batch, i int) error {
			_, err := s.updateItem(b, fmt.Sprintf("p-%04d", i), func(it *reviewItem) {
				it.OpenedAt, it.SLAMs = now.Add(-time.Duration(i)*time.Second), 3_600_000
				it.Owner, it.Class, it.Reason = "ai_product", string(event.ClassModelRefusal), "refused"
			})
			return err
		})
		p := &person{Name: "rita", Roles: []string{RoleReviewer}, Owners: []string{"*"}}
		body, _ := render(t, s, p, "/review", s.reviewPage)
		if got, want := strings.Contains(body, `id="next-page"`), n > queuePage; got != want {
			t.Errorf("a queue of %d items: next page link %v, want %v", n, got, want)
		}
	}
}
