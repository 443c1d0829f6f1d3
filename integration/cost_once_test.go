package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/checker"
	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// sampleSum sums every sample of one metric family of a router's /metrics.
func sampleSum(t *testing.T, url, family string) float64 {
	t.Helper()
	body, err := httpGet(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return metricSum(body, family)
}

// TestCostCountsEachAttemptOnce guards the cost ledger on a real router:
// each attempt's usage is counted once and a task's cost prevented never
// exceeds what its baseline had left, the same in `faultrouter cost`, the
// router's metrics and the checker, to the micro-dollar; and the what-if of
// the running policy over the same range, which holds retries, a re-drive
// and a task whose state expired, disagrees with no recorded decision.
//
//   - t-fwd: a $0.25 timeout put on the wrong partition for its task (as
//     librdkafka's default partitioner does): forwarded, one attempt;
//   - t-ttl: a $0.20 timeout of a task with a 1.5 s SLA, delivered again
//     after its state expired: one attempt;
//   - t-dl: three timeouts ($0.01, $0.02, $0.03) to a dead letter, then
//     re-driven by an operator: three attempts, and no cost prevented (the
//     re-drive is the attempt its baseline had left);
//   - t-unk: a $0.10 write whose outcome is unknown, approved by a
//     reviewer, then unknown again: two attempts, and cost prevented of the
//     2 attempts its baseline (4) had left, $0.20, not 3 + 2.
func TestCostCountsEachAttemptOnce(t *testing.T) {
	e := newEnv(t)
	r := e.startRouter("a", t.TempDir())
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ingress := e.prefix + "ai.tasks.ingress"
	home := kgo.StickyKeyPartitioner(nil).ForTopic(ingress)
	since := time.Now().Add(-time.Second)
	audits := 0
	produce := func(ev event.TaskEvent, misplace bool) {
		t.Helper()
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		rec := &kgo.Record{Topic: ingress, Key: []byte(ev.TaskID), Value: v}
		p := int32(home.Partition(rec, 3))
		if misplace {
			p = (p + 1) % 3
		}
		rec.Partition = p
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	waitAudits := func(n int) {
		t.Helper()
		audits += n
		if !waitFor(90*time.Second, func() bool { return len(readTopic(ctx, t, e.prefix+"ai.tasks.audit", true)) >= audits }) {
			t.Fatalf("fewer than %d audit records after 90 s", audits)
		}
	}
	sla := int64(1500)
	ev := func(task, id string, n int32, cost float64) event.TaskEvent {
		return event.TaskEvent{EventID: id, TaskID: task, Attempt: n, OccurredAt: event.At(time.Now()), Source: "worker", Action: "answer_ticket",
			Provider: "openai", Model: "gpt-4o", Stage: event.StageNetwork, Status: event.StatusError,
			Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504}, Usage: event.Usage{CostUSD: cost, Tokens: 10, ElapsedMs: 100}}
	}

	produce(ev("t-fwd", "fwd-1", 1, 0.25), true)
	waitAudits(2) // the forward and its copy's decision
	ttl := ev("t-ttl", "ttl-1", 1, 0.20)
	ttl.SLAMs = &sla
	produce(ttl, false)
	for i, cost := range []float64{0.01, 0.02, 0.03} {
		produce(ev("t-dl", fmt.Sprintf("dl-%d", i+1), int32(i+1), cost), false)
	}
	unk := func(id string, n int32) event.TaskEvent {
		x := ev("t-unk", id, n, 0.10)
		x.Stage, x.Action = event.StageBusiness, "refund"
		x.Operation = &event.Operation{OpID: "refund-1", Kind: event.OpWrite, ParamsSHA256: strings.Repeat("a", 64), State: event.OpUnknown}
		return x
	}
	produce(unk("unk-1", 1), false)
	waitAudits(5)
	e.cli("", "review", "decide", "--task", "t-unk", "--approve", "--reason", "the refund did not go through", "--reviewer", "ana")
	waitAudits(1)
	produce(unk("unk-2", 2), false)
	waitAudits(1)
	e.cli("", "replay", "--topic", "deadletter", "--task", "t-dl", "--redrive-to", "ingress", "--operator", "carol")
	waitAudits(1)
	// t-ttl's state lives 2 x 1.5 s after its retry was published (1 s
	// after its decision): its redelivery 6 s later finds none
	time.Sleep(6 * time.Second)
	produce(ttl, false)
	waitAudits(1)

	var got struct {
		Attempts     int64   `json:"attempts"`
		TotalUSD     float64 `json:"total_usd"`
		FailedUSD    float64 `json:"failed_usd"`
		PreventedUSD float64 `json:"prevented_usd"`
	}
	out := e.cli("", "cost", "--since", since.UTC().Format(time.RFC3339Nano), "--format", "json")
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("cost --format json: %v\n%s", err, out)
	}
	// 0.25 + 0.20 + 0.01 + 0.02 + 0.03 + 0.10 + 0.10
	if got.Attempts != 7 || micros(got.TotalUSD) != 710_000 || micros(got.PreventedUSD) != 200_000 {
		t.Errorf("cost: %d attempts, %s spent, %s prevented; want 7 attempts, $0.71 (each once), $0.20 prevented (t-unk's baseline had 2 left; t-dl's re-drive nets off the one its dead letter claimed)\n%s",
			got.Attempts, ledger.Dollars(got.TotalUSD), ledger.Dollars(got.PreventedUSD), out)
	}

	// the router's metrics: the same sums
	spend := sampleSum(t, r.metrics, "faultrouter_spend_usd_total")
	prevented := sampleSum(t, r.metrics, "faultrouter_cost_prevented_usd_total") - sampleSum(t, r.metrics, "faultrouter_cost_prevented_netted_usd_total")
	if micros(spend) != micros(got.TotalUSD) || micros(prevented) != micros(got.PreventedUSD) {
		t.Errorf("metrics: %s spent, %s prevented; faultrouter cost says %s, %s", ledger.Dollars(spend), ledger.Dollars(prevented),
			ledger.Dollars(got.TotalUSD), ledger.Dollars(got.PreventedUSD))
	}

	// the console's Cost page: the same attempts and sums
	con := e.startConsole(fmt.Sprintf("users:\n  - {name: vera, password_bcrypt: %q, roles: [viewer]}\n", e.hashPassword("s3cret-pw")))
	vera := newHTTPPerson(t, con.url)
	vera.login("vera", "s3cret-pw")
	want := costCards{total: ledger.Dollars(got.TotalUSD), prevented: ledger.Dollars(got.PreventedUSD), attempts: got.Attempts}
	var page costCards
	if !waitFor(60*time.Second, func() bool {
		_, body := vera.get("/cost")
		page = readCostCards(body)
		return page == want
	}) {
		t.Errorf("the console's Cost page shows %+v; faultrouter cost says %+v", page, want)
	}

	// the checker: every audit record summed as cost sums them, equal to
	// its model's decisions
	topic := func(short string) string { return e.prefix + "ai.tasks." + short }
	logs := checker.Logs{Ingress: readTopic(ctx, t, topic("ingress"), true), Decisions: readTopic(ctx, t, topic("review.decisions"), true),
		Audit: readTopic(ctx, t, topic("audit"), true), Retry: readTopic(ctx, t, topic("retry"), true), Review: readTopic(ctx, t, topic("review"), true),
		DeadLetter: readTopic(ctx, t, topic("deadletter"), true), Alerts: readTopic(ctx, t, topic("alerts"), true), End: time.Now()}
	rep, err := checker.Check(logs, checker.Options{Policy: policy.Default(), Ingress: topic("ingress"), Decisions: topic("review.decisions"), Partitions: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ledger.total", "ledger.class", "audit.repeat", "audit.prevented", "audit.decision"} {
		if n := rep.ViolationsByCheck[k]; n > 0 {
			t.Errorf("checker: %d %s violations: %v", n, k, rep.Violations)
		}
	}
	if l := rep.Ledger; l == nil || l.Attempts != got.Attempts || micros(l.SpendUSD) != micros(got.TotalUSD) || micros(l.PreventedUSD) != micros(got.PreventedUSD) {
		t.Errorf("checker's ledger %v, faultrouter cost says %d attempts, %s, %s prevented", l, got.Attempts, ledger.Dollars(got.TotalUSD), ledger.Dollars(got.PreventedUSD))
	}

	// the what-if of the running policy over the range: its retries and
	// t-ttl's expiry replayed as the router ran them
	current := filepath.Join(t.TempDir(), "current.yaml")
	if err := os.WriteFile(current, []byte(e.cli("", "policy", "default")), 0o644); err != nil {
		t.Fatal(err)
	}
	var w struct {
		Decisions     int            `json:"decisions"`
		Disagreements int            `json:"disagreements"`
		Why           map[string]int `json:"disagreements_why"`
		Examples      []any          `json:"disagreement_examples"`
		Limits        []struct {
			Limit     string `json:"limit"`
			Decisions int    `json:"decisions"`
		} `json:"limits"`
	}
	out = e.cli("", "policy", "whatif", "--policy", current, "--baseline", current, "--since", since.UTC().Format(time.RFC3339Nano), "--format", "json")
	if err := json.Unmarshal([]byte(out), &w); err != nil {
		t.Fatalf("whatif: %v\n%s", err, out)
	}
	if w.Disagreements != 0 || w.Decisions == 0 {
		t.Errorf("the running policy over its own range: %d disagreements (%v: %v) of %d decisions; want 0", w.Disagreements, w.Why, w.Examples, w.Decisions)
	}
	ttlLimit := -1
	for _, l := range w.Limits {
		if l.Limit == "" {
			t.Errorf("a limit without its text: %+v", l)
		}
		if strings.Contains(l.Limit, "(its TTL)") {
			ttlLimit = l.Decisions
		}
	}
	timeline := e.cli("", "replay", "--task", "t-ttl", "--timeline")
	if !strings.Contains(timeline, "redelivery_after_ttl") && strings.Count(timeline, "NETWORK_TIMEOUT -> RETRY") < 2 {
		t.Errorf("t-ttl was not decided afresh after its state expired:\n%s", timeline)
	}
	if ttlLimit < 1 {
		t.Errorf("the limits do not count the decision on t-ttl's expired state (%d): %+v", ttlLimit, w.Limits)
	}
}

// costCards are the totals the console's Cost page shows.
type costCards struct {
	total, prevented string
	attempts         int64
}

var (
	costTotal     = regexp.MustCompile(`id="cost-total">([^<]*)</b><small>(\d+) `)
	costPrevented = regexp.MustCompile(`id="cost-prevented">([^<]*)<`)
)

// readCostCards reads the totals off the Cost page's HTML.
func readCostCards(body string) costCards {
	var c costCards
	if m := costTotal.FindStringSubmatch(body); m != nil {
		c.total = m[1]
		c.attempts, _ = strconv.ParseInt(m[2], 10, 64)
	}
	if m := costPrevented.FindStringSubmatch(body); m != nil {
		c.prevented = m[1]
	}
	return c
}
