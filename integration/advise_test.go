package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"

	seeded "github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// produceAdvice produces one of the advisor's streams (internal/workload)
// through the running router of e: its task events, then, once each has its
// audit record (a reviewer decides an open item), its review decisions, and
// waits for theirs. audited is the audit records there were before.
func produceAdvice(t *testing.T, e *env, a seeded.Advice, audited int) int {
	t.Helper()
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var recs []*kgo.Record
	for i := range a.Events {
		v, err := c.EncodeTaskEvent(nil, &a.Events[i])
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: e.prefix + "ai.tasks.ingress", Key: []byte(a.Events[i].TaskID), Value: v})
	}
	wait := func(n int) {
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if !waitFor(3*time.Minute, func() bool { return len(readTopic(ctx, t, e.prefix+"ai.tasks.audit", true)) >= n }) {
			t.Fatalf("fewer than %d audit records after 3 min", n)
		}
	}
	audited += len(recs)
	wait(audited)
	recs = recs[:0]
	for i := range a.Decisions {
		v, err := c.EncodeReviewDecision(nil, &a.Decisions[i])
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: e.prefix + "ai.tasks.review.decisions", Key: []byte(a.Decisions[i].TaskID), Value: v})
	}
	audited += len(recs)
	wait(audited)
	return audited
}

// adviceJSON is what the test reads of `policy advise --format json`.
type adviceJSON struct {
	Proposals []struct {
		Kind   string
		Class  string
		Owner  string
		Match  *map[string]string
		Change struct {
			Section  string
			Key      string
			From, To float64
		}
		Evidence struct {
			Count    int
			Hits     int
			Value    float64
			Interval struct{ Lo, Hi float64 }
		}
	}
	Candidate     string `json:"candidate"`
	CandidateFile string `json:"candidate_file"`
	Whatif        *struct {
		Disagreements int `json:"disagreements"`
		Retries       struct{ Baseline, Candidate int }
		Cost          struct {
			RemovedAttempts int `json:"removed_attempts"`
			AddedAttempts   int `json:"added_attempts"`
		} `json:"cost"`
		Review []struct {
			Owner               string
			Baseline, Candidate int
		} `json:"review_load"`
	} `json:"whatif"`
	WhatifError string `json:"whatif_error"`
}

// TestPolicyAdviseFindsTheTruth guards `faultrouter policy advise` on a real
// broker and router. Over the workload's stream whose truth is known (a
// provider whose timeouts never clear after the first retry, a model whose
// refusals at confidence 0.65-0.75 reviewers approve 90% of the time, an
// owner who answers in 2 h against a 30 min SLA) it proposes exactly those
// three changes, each with an interval that holds the truth, writes them as
// a candidate policy that policy check accepts, and the candidate's
// what-if shows fewer attempts and fewer review items than the running
// policy. Over the same tasks without the patterns, it proposes nothing and
// writes no file.
func TestPolicyAdviseFindsTheTruth(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	base := time.Now().Add(-6 * time.Hour).Truncate(time.Second)
	start := time.Now().Add(-time.Second)
	n := produceAdvice(t, e, seeded.AdviceStream("plain", base, false), 0)
	mid := time.Now()
	produceAdvice(t, e, seeded.AdviceStream("truth", base, true), n)
	dir := t.TempDir()
	advise := func(out string, args ...string) adviceJSON {
		stdout := e.cli("", append([]string{"policy", "advise", "--format", "json", "--out", out}, args...)...)
		var r adviceJSON
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("policy advise: %v\n%s", err, stdout)
		}
		return r
	}
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

	plainFile := filepath.Join(dir, "plain.yaml")
	plain := advise(plainFile, "--since", stamp(start), "--until", stamp(mid))
	if len(plain.Proposals) != 0 || plain.Candidate != "" || plain.Whatif != nil {
		t.Errorf("the stream without the patterns: %d proposals %+v, candidate %q; want none", len(plain.Proposals), plain.Proposals, plain.Candidate)
	}
	if _, err := os.Stat(plainFile); !os.IsNotExist(err) {
		t.Errorf("nothing proposed, yet %s was written (%v)", plainFile, err)
	}

	file := filepath.Join(dir, "candidate.yaml")
	r := advise(file, "--since", stamp(mid))
	if len(r.Proposals) != 3 {
		t.Fatalf("%d proposals, want 3: %+v", len(r.Proposals), r.Proposals)
	}
	got := map[string]bool{}
	for _, p := range r.Proposals {
		ev := p.Evidence
		holds := func(v float64) bool { return ev.Interval.Lo <= v && v <= ev.Interval.Hi }
		switch {
		case p.Kind == "max_retries" && p.Class == string(event.ClassNetworkTimeout) && p.Match != nil &&
			(*p.Match)["provider"] == seeded.StuckProvider && (*p.Match)["model"] == "*" && p.Change.From == 2 && p.Change.To == 1:
			got["timeouts"] = true
			if ev.Hits != 0 || ev.Count < 30 || !holds(0) {
				t.Errorf("the stuck provider's evidence %+v: want 0 successes of 30 or more second retries, an interval holding 0", ev)
			}
		case p.Kind == "min_confidence" && p.Match != nil && (*p.Match)["provider"] == seeded.TrustedProvider &&
			(*p.Match)["model"] == seeded.TrustedModel && p.Change.From == 0.75 && p.Change.To == seeded.TrustedFrom:
			got["refusals"] = true
			if ev.Count < 30 || !holds(seeded.TrustedApproval) {
				t.Errorf("the trusted model's evidence %+v: want 30 or more items, an interval holding %v", ev, seeded.TrustedApproval)
			}
		case p.Kind == "sla_ms" && p.Owner == seeded.SlowOwner && p.Match == nil && p.Change.From == 1_800_000 && p.Change.To >= 7_200_000:
			got["sla"] = true
			if ev.Count < 30 || !holds(float64(seeded.SlowWait.Milliseconds())) {
				t.Errorf("the slow owner's evidence %+v: want 30 or more items, a median interval holding 2 h", ev)
			}
		default:
			t.Errorf("a proposal the truth does not hold: %+v", p)
		}
	}
	if len(got) != 3 {
		t.Errorf("proposals found %v of timeouts, refusals, sla", got)
	}

	// the candidate: written, accepted by policy check, the overrides named
	if b, err := os.ReadFile(file); err != nil || string(b) != r.Candidate || r.CandidateFile != file {
		t.Errorf("--out %s: %q (%v), want the candidate of the JSON", file, b, err)
	}
	if out := e.cli("", "policy", "check", file); !strings.Contains(out, "ok") {
		t.Errorf("policy check of the candidate: %s", out)
	}
	for _, want := range []string{"overrides:", "provider: " + seeded.StuckProvider, "network_timeout: {max_retries: 1}", "model_refusal: {min_confidence: 0.65}", "owners:"} {
		if !strings.Contains(r.Candidate, want) {
			t.Errorf("the candidate lacks %q:\n%s", want, r.Candidate)
		}
	}

	// its what-if: fewer attempts, fewer review items
	w := r.Whatif
	if w == nil {
		t.Fatalf("no what-if of the candidate: %s", r.WhatifError)
	}
	if w.Retries.Candidate >= w.Retries.Baseline || w.Cost.RemovedAttempts <= w.Cost.AddedAttempts {
		t.Errorf("what-if retries %+v, attempts stopped %d and added %d: want fewer attempts", w.Retries, w.Cost.RemovedAttempts, w.Cost.AddedAttempts)
	}
	items := [2]int{}
	for _, o := range w.Review {
		items[0] += o.Baseline
		items[1] += o.Candidate
	}
	if items[1] >= items[0] {
		t.Errorf("what-if review items %d -> %d (%+v), want fewer", items[0], items[1], w.Review)
	}

	// the table: proposals with evidence, then the what-if
	table := e.cli("", "policy", "advise", "--since", stamp(mid))
	for _, want := range []string{"proposals: 3", "evidence:", "candidate policy (--out FILE", "what-if of the candidate against the running policy", "REVIEW ITEMS PER OWNER", "success by retry number"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if strings.Index(table, "what-if of the candidate") < strings.Index(table, "evidence:") {
		t.Errorf("the what-if is not printed below the proposals:\n%s", table)
	}
}

// TestConsoleAdviseInTheBrowser guards the console's Advise page as an
// operator uses it in Chromium, on the advisor's stream whose truth is known
// routed by a real router: the page shows the three proposals, each with
// its evidence and its plot (bars with their intervals), the candidate
// policy and its what-if against the running policy; its button opens the
// What-if page with the candidate, which replays it. The page is screenshot
// (console-advise.png).
func TestConsoleAdviseInTheBrowser(t *testing.T) {
	ctx := browser(t)
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	produceAdvice(t, e, seeded.AdviceStream("truth", time.Now().Add(-6*time.Hour).Truncate(time.Second), true), 0)
	c := e.startConsole(fmt.Sprintf("users:\n  - {name: olga, password_bcrypt: %q, roles: [operator]}\n", e.hashPassword("s3cret-pw")))
	run(t, ctx, c, "sign in to the Advise page",
		chromedp.Navigate(c.url+"/advise"), chromedp.WaitVisible(css("#name")),
		chromedp.SendKeys(css("#name"), "olga"), chromedp.SendKeys(css("#password"), "s3cret-pw"),
		chromedp.Click(css("#signin")), chromedp.WaitVisible(css("#advise-form")),
	)
	run(t, ctx, c, "advise over the last hour",
		chromedp.SetValue(css("#advise-hours"), "1"),
		chromedp.Click(css("#advise-run")),
		chromedp.WaitVisible(css("#advise-summary")),
		shot(t, "console-advise.png"),
	)
	if got := text(t, ctx, c, "#advise-count"); got != "3" {
		t.Fatalf("the page shows %q proposals, want 3", got)
	}
	count := func(sel string) int {
		tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll("`+sel+`").length`))
		if err != nil {
			t.Fatalf("counting %s: %v", sel, err)
		}
		return n
	}
	kinds := map[string]string{}
	for i := range 3 {
		sec := fmt.Sprintf("#proposal-%d", i)
		head := text(t, ctx, c, sec+" h2")
		kinds[head] = text(t, ctx, c, sec+" .evidence")
		if n := count(sec + " svg.plot rect.bar"); n < 2 {
			t.Errorf("%s (%s) draws %d bars, want a plot", sec, head, n)
		}
	}
	for _, want := range []string{"network_timeout.max_retries 2 -> 1 for provider=" + seeded.StuckProvider,
		"model_refusal.min_confidence 0.75 -> 0.65 for provider=" + seeded.TrustedProvider + " model=" + seeded.TrustedModel,
		"owners." + seeded.SlowOwner + ".sla_ms 30m0s -> "} {
		found := false
		for head, evidence := range kinds {
			if strings.HasPrefix(head, want) && strings.Contains(evidence, "95% interval") {
				found = true
			}
		}
		if !found {
			t.Errorf("no proposal %q with its evidence; the page shows %v", want, kinds)
		}
	}
	if n := count("svg.plot line.interval"); n < 4 {
		t.Errorf("the plots draw %d interval whiskers, want one per bar of rates", n)
	}
	if got := text(t, ctx, c, "#advise-candidate"); !strings.Contains(got, "overrides:") || !strings.Contains(got, "owners:") {
		t.Errorf("the candidate reads %q, want its overrides and owners", got)
	}
	if got := text(t, ctx, c, "#advise-whatif-changed"); got == "0" || got == "" {
		t.Errorf("the what-if of the candidate changes %q decisions, want some", got)
	}
	run(t, ctx, c, "open the candidate in the What-if page",
		chromedp.Click(css("#advise-open-whatif")),
		chromedp.WaitVisible(css("#whatif-summary")),
	)
	if got, err := chromedp.Run(ctx, chromedp.Value(css("#policy"))); err != nil || !strings.Contains(got, "overrides:") {
		t.Errorf("the What-if page holds the candidate %q (%v), want the advisor's", got, err)
	}
	if got := text(t, ctx, c, "#whatif-changed"); got == "0" || got == "" {
		t.Errorf("the What-if page shows %q changed decisions, want the candidate's", got)
	}
}
