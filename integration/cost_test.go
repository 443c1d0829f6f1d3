package integration

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/ledger"
	seeded "github.com/faultrouter/faultrouter/internal/workload"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// costWorkload produces the seeded workload of make bench (internal/workload)
// through a running router, waits until every event has its audit record,
// and returns the events produced and the start of the range.
func costWorkload(t *testing.T, e *env, tasks int) ([][]event.TaskEvent, time.Time) {
	t.Helper()
	e.startRouter("a", t.TempDir())
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Add(-time.Second)
	at := time.Now().Add(-time.Hour).Truncate(time.Second)
	var recs []*kgo.Record
	byTask := make([][]event.TaskEvent, tasks)
	for i := range tasks {
		for n := 1; n <= 3; n++ {
			ev := seeded.Event("cost", 24, i, n, at.Add(time.Duration(i)*time.Millisecond+time.Duration(n)*10*time.Second))
			v, err := c.EncodeTaskEvent(nil, &ev)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, &kgo.Record{Topic: e.prefix + "ai.tasks.ingress", Key: []byte(ev.TaskID), Value: v})
			byTask[i] = append(byTask[i], ev)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if !waitFor(3*time.Minute, func() bool { return len(readTopic(ctx, t, e.prefix+"ai.tasks.audit", true)) >= len(recs) }) {
		t.Fatalf("fewer than %d audit records after 3 min", len(recs))
	}
	return byTask, since
}

// expectedLedger is the ledger the test computes from the events it
// produced, from the shapes of internal/workload (not with the policy's code): a
// redelivery (same event_id) is one attempt; an attempt succeeds when it is
// the task's first OK before the task ended, or the receipt of a held write;
// a task ends at its third timeout (dead letter), a refusal (review), a
// second 401, a business rejection, a write without receipt (held) or a
// success. A dead letter, a refusal and a held write stop the task: the
// default baseline (4 attempts) would have made 4 - attempts more, at the
// task's mean attempt cost, counting every attempt of the task (those after
// the stop netted off).
type expectedLedger struct {
	total, failed, prevented int64 // micro-dollars
	deadLettered             []string
}

func micros(v float64) int64 { return int64(math.Round(v * 1e6)) }

func computeLedger(byTask [][]event.TaskEvent) expectedLedger {
	var x expectedLedger
	for _, evs := range byTask {
		seen := map[string]bool{}
		ended, stopped, receipted, timeouts, auths, attempts := false, false, false, 0, 0, 0
		var spent int64
		stop := func() { stopped, ended = true, true }
		for _, ev := range evs {
			if seen[ev.EventID] {
				continue
			}
			seen[ev.EventID] = true
			attempts++
			cost := micros(ev.Usage.CostUSD)
			spent += cost
			x.total += cost
			failed := true
			switch {
			case ev.Operation != nil && ev.Operation.State == event.OpSubmitted:
				stop() // held: outcome unknown
			case ev.Operation != nil && ev.Operation.State == event.OpConfirmed:
				// the receipt of the held write succeeds; a second one is
				// work for an ended task
				failed, receipted = receipted, true
			case ended:
			case ev.Status == event.StatusOK:
				failed, ended = false, true
			case ev.Error != nil && ev.Error.Type == "TimeoutError":
				if timeouts++; timeouts > 2 {
					stop()
					x.deadLettered = append(x.deadLettered, ev.TaskID)
				}
			case ev.Error != nil && ev.Error.HTTPStatus == 401:
				if auths++; auths > 1 {
					ended = true
				}
			case ev.Error != nil && ev.Error.HTTPStatus == 422:
				ended = true
			case ev.Output != nil && strings.Contains(ev.Output.Text, "sorry"):
				stop()
			}
			if failed {
				x.failed += cost
			}
		}
		// a stopped task's claims add up to what its baseline had left
		// after its last attempt
		if n := int64(attempts); stopped && n < 4 {
			x.prevented += (spent*(4-n) + n/2) / n
		}
	}
	return x
}

// TestCostTotalsMatchTheEvents guards `faultrouter cost`: over the range of a
// seeded workload routed by a real router, total_usd is the sum of
// usage.cost_usd of the events produced (a redelivery once), failed_usd that
// of the attempts not decided SUCCEEDED, the per-class rows add up to the
// total, and prevented_usd is the cost prevented against the stated
// baseline, as the test computes it from the events.
func TestCostTotalsMatchTheEvents(t *testing.T) {
	e := newEnv(t)
	byTask, since := costWorkload(t, e, 200)
	want := computeLedger(byTask)

	out := e.cli("", "cost", "--since", since.UTC().Format(time.RFC3339Nano), "--format", "json")
	var got struct {
		TotalUSD     float64 `json:"total_usd"`
		FailedUSD    float64 `json:"failed_usd"`
		SucceededUSD float64 `json:"succeeded_usd"`
		PreventedUSD float64 `json:"prevented_usd"`
		Classes      []struct {
			Key     string  `json:"key"`
			CostUSD float64 `json:"cost_usd"`
		} `json:"classes"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("cost --format json: %v\n%s", err, out)
	}
	if micros(got.TotalUSD) != want.total || micros(got.FailedUSD) != want.failed || micros(got.PreventedUSD) != want.prevented {
		t.Errorf("cost: total %v, failed %v, prevented %v; want %v, %v, %v (micro-dollars)\n%s",
			micros(got.TotalUSD), micros(got.FailedUSD), micros(got.PreventedUSD), want.total, want.failed, want.prevented, out)
	}
	if micros(got.SucceededUSD) != want.total-want.failed {
		t.Errorf("succeeded_usd %v, want total - failed = %v micro-dollars", micros(got.SucceededUSD), want.total-want.failed)
	}
	var classes int64
	for _, c := range got.Classes {
		classes += micros(c.CostUSD)
	}
	if classes != want.total {
		t.Errorf("the class rows add up to %d micro-dollars, want %d", classes, want.total)
	}
	// a range after everything holds nothing
	empty := e.cli("", "cost", "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "--until", time.Now().Add(2*time.Hour).UTC().Format(time.RFC3339), "--format", "json")
	if !strings.Contains(empty, `"total_usd": 0,`) {
		t.Errorf("a range with no decision reports spend:\n%s", empty)
	}
	table := e.cli("", "cost", "--since", since.UTC().Format(time.RFC3339Nano))
	for _, s := range []string{"cost prevented", "NETWORK_TIMEOUT", "PROVIDER/MODEL", "PROMPT TEMPLATE", "dead_letter"} {
		if !strings.Contains(table, s) {
			t.Errorf("the cost table lacks %q:\n%s", s, table)
		}
	}
	if _, errOut, err := e.tryCLI("", "cost", "--since", "yesterday"); err == nil || !strings.Contains(errOut, "--since") {
		t.Errorf("cost --since yesterday: err %v, stderr %q; want an error naming --since", err, errOut)
	}
}

// TestWhatIfOnTheWorkload guards `faultrouter policy whatif` on a seeded
// workload routed by a real router: the running policy against itself
// changes nothing and disagrees with no recorded decision; a candidate that
// raises network_timeout.max_retries from 2 to 4 changes exactly the third
// timeout of the tasks whose three attempts all timed out (the test finds
// them in the events), from DEADLETTER to RETRY, and no other decision; its
// cost figures are the sums the test computes from the events (every
// attempt replayed, observed; each added retry at the mean cost of the
// timeouts of its provider/model, estimated).
func TestWhatIfOnTheWorkload(t *testing.T) {
	e := newEnv(t)
	byTask, since := costWorkload(t, e, 300)
	want := computeLedger(byTask).deadLettered
	slices.Sort(want)
	if len(want) == 0 {
		t.Fatal("the workload holds no task whose three attempts timed out: the test would prove nothing")
	}
	dir := t.TempDir()
	current := filepath.Join(dir, "current.yaml")
	if err := os.WriteFile(current, []byte(e.cli("", "policy", "default")), 0o644); err != nil {
		t.Fatal(err)
	}
	candidate := filepath.Join(dir, "candidate.yaml")
	if err := os.WriteFile(candidate, []byte("network_timeout:\n  max_retries: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sinceArg := since.UTC().Format(time.RFC3339Nano)

	type report struct {
		Decisions     int            `json:"decisions"`
		Disagreements int            `json:"disagreements"`
		Why           map[string]int `json:"disagreements_why"`
		Changed       int            `json:"changed"`
		ChangedTasks  int            `json:"changed_tasks"`
		Matrix        []struct {
			Class, From, To string
			Count           int
			Changed         bool
			Examples        []string
		} `json:"matrix"`
		Retries struct{ Added, Removed int } `json:"retries"`
		Cost    struct {
			AddedAttempts   int     `json:"added_attempts"`
			AddedUSD        float64 `json:"added_usd_estimated"`
			RemovedAttempts int     `json:"removed_attempts"`
			ObservedUSD     float64 `json:"observed_usd"`
		} `json:"cost"`
	}
	run := func(args ...string) report {
		out := e.cli("", append([]string{"policy", "whatif", "--since", sinceArg, "--format", "json"}, args...)...)
		var r report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("whatif: %v\n%s", err, out)
		}
		return r
	}

	self := run("--policy", current, "--baseline", current)
	if self.Disagreements != 0 || self.Changed != 0 || self.Decisions != 900 {
		t.Errorf("the running policy against itself: %d decisions, %d changed, %d disagreements; want 900, 0, 0", self.Decisions, self.Changed, self.Disagreements)
	}

	r := run("--policy", candidate)
	if r.Disagreements != 0 || r.Changed != len(want) || r.ChangedTasks != len(want) {
		t.Errorf("max_retries 4: %d changed decisions of %d tasks, %d disagreements; want %d, %d, 0", r.Changed, r.ChangedTasks, r.Disagreements, len(want), len(want))
	}
	for _, c := range r.Matrix {
		if c.Changed && (c.Class != "NETWORK_TIMEOUT" || c.From != "DEADLETTER" || c.To != "RETRY" || c.Count != len(want) || len(c.Examples) == 0) {
			t.Errorf("changed cell %+v, want only NETWORK_TIMEOUT DEADLETTER -> RETRY, %d", c, len(want))
		}
	}
	// the cost: every attempt replayed, observed; each added retry at the
	// mean cost of the NETWORK_TIMEOUT attempts of its provider/model
	// (internal/workload's timeouts on no write), estimated
	sums, counts := map[string]int64{}, map[string]int64{}
	modelOf := map[string]string{}
	for _, evs := range byTask {
		for _, ev := range evs {
			modelOf[ev.TaskID] = ev.Provider + "/" + ev.Model
			if ev.Error != nil && ev.Error.Type == "TimeoutError" && ev.Operation == nil {
				sums[modelOf[ev.TaskID]] += micros(ev.Usage.CostUSD)
				counts[modelOf[ev.TaskID]]++
			}
		}
	}
	var added float64
	for _, task := range want {
		m := modelOf[task]
		added += float64(sums[m]) / float64(counts[m]) / 1e6
	}
	if r.Retries.Added != len(want) || r.Retries.Removed != 0 || r.Cost.AddedAttempts != len(want) || r.Cost.RemovedAttempts != 0 ||
		math.Abs(r.Cost.AddedUSD-added) > 1e-6 || micros(r.Cost.ObservedUSD) != computeLedger(byTask).total {
		t.Errorf("retries %+v, cost %+v; want %d added, 0 removed, %.6f estimated, %d micro-dollars observed",
			r.Retries, r.Cost, len(want), added, computeLedger(byTask).total)
	}

	rows, err := csv.NewReader(strings.NewReader(e.cli("", "policy", "whatif", "--policy", candidate, "--since", sinceArg, "--format", "csv"))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, row := range rows[1:] {
		got = append(got, row[0])
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("CSV of changed tasks:\n%v\nwant:\n%v", got, want)
	}

	table := e.cli("", "policy", "whatif", "--policy", candidate, "--since", sinceArg)
	if !strings.HasPrefix(table, "range:") || !strings.Contains(strings.SplitN(table, "\n", 3)[1], "disagreements: 0") || !strings.Contains(table, "limits of a what-if") {
		t.Errorf("the table does not open with the self-check or lacks its limits:\n%s", table)
	}
	if _, errOut, err := e.tryCLI("", "policy", "whatif", "--since", sinceArg); err == nil || !strings.Contains(errOut, "--policy") {
		t.Errorf("whatif without --policy: err %v, stderr %q; want an error naming --policy", err, errOut)
	}
	// a baseline that is not the policy that ran: the self-check says so
	off := run("--policy", current, "--baseline", candidate)
	if off.Disagreements == 0 || off.Why["baseline_differs_from_running_policy"] != off.Disagreements {
		t.Errorf("a baseline of max_retries 4 against the audit of 2: %d disagreements, why %v; want every one put down to the baseline",
			off.Disagreements, off.Why)
	}
}

// TestConsoleCostPageInTheBrowser guards the console's Cost page as a person
// sees it in Chromium, on a seeded workload routed by a real router: the
// spend, failed spend and cost prevented it shows are those `faultrouter
// cost` prints for the same records, the charts are drawn (spend per hour
// by class, cost prevented per hour) and the top models and templates are
// listed. The page is screenshot (console-cost.png).
func TestConsoleCostPageInTheBrowser(t *testing.T) {
	ctx := browser(t)
	e := newEnv(t)
	_, since := costWorkload(t, e, 150)
	var want struct {
		TotalUSD     float64 `json:"total_usd"`
		FailedUSD    float64 `json:"failed_usd"`
		PreventedUSD float64 `json:"prevented_usd"`
	}
	out := e.cli("", "cost", "--since", since.UTC().Format(time.RFC3339Nano), "--format", "json")
	if err := json.Unmarshal([]byte(out), &want); err != nil {
		t.Fatal(err)
	}
	c := e.startConsole(fmt.Sprintf("users:\n  - {name: vera, password_bcrypt: %q, roles: [viewer]}\n", e.hashPassword("s3cret-pw")))
	run(t, ctx, c, "sign in to the Cost page",
		chromedp.Navigate(c.url+"/cost"), chromedp.WaitVisible(css("#name")),
		chromedp.SendKeys(css("#name"), "vera"), chromedp.SendKeys(css("#password"), "s3cret-pw"),
		chromedp.Click(css("#signin")), chromedp.WaitVisible(css("#cost-totals")),
		textUntil(c.url+"/cost", "#cost-total", ledger.Dollars(want.TotalUSD)),
		shot(t, "console-cost.png"),
	)
	for sel, v := range map[string]float64{"#cost-total": want.TotalUSD, "#cost-failed": want.FailedUSD, "#cost-prevented": want.PreventedUSD} {
		if got := text(t, ctx, c, sel); got != ledger.Dollars(v) {
			t.Errorf("%s shows %q, faultrouter cost says %s", sel, got, ledger.Dollars(v))
		}
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
	spend, prevented := count("#spend-chart rect.seg"), count("#prevented-chart rect.seg")
	if spend == 0 || prevented == 0 {
		t.Errorf("the charts draw %d spend and %d prevented segments, want some of each", spend, prevented)
	}
	if rows := text(t, ctx, c, "#cost-models tbody"); !strings.Contains(rows, "/") {
		t.Errorf("no provider/model listed by failed spend: %q", rows)
	}
}

// TestConsoleWhatifInTheBrowser guards the console's What-if page as an
// operator uses it in Chromium, on a seeded workload routed by a real
// router: a candidate raising network_timeout.max_retries to 4, pasted into
// the page, shows 0 disagreements first, then exactly the changed decisions
// the test computes from the events (the third timeouts, DEADLETTER ->
// RETRY), with links to their timelines; the same candidate uploaded as a
// file shows the same. The page is screenshot (console-whatif.png).
func TestConsoleWhatifInTheBrowser(t *testing.T) {
	ctx := browser(t)
	e := newEnv(t)
	byTask, _ := costWorkload(t, e, 300)
	want := computeLedger(byTask).deadLettered
	if len(want) == 0 {
		t.Fatal("the workload holds no task whose three attempts timed out: the test would prove nothing")
	}
	c := e.startConsole(fmt.Sprintf("users:\n  - {name: olga, password_bcrypt: %q, roles: [operator]}\n", e.hashPassword("s3cret-pw")))
	run(t, ctx, c, "sign in to the What-if page",
		chromedp.Navigate(c.url+"/whatif"), chromedp.WaitVisible(css("#name")),
		chromedp.SendKeys(css("#name"), "olga"), chromedp.SendKeys(css("#password"), "s3cret-pw"),
		chromedp.Click(css("#signin")), chromedp.WaitVisible(css("#whatif-form")),
	)
	run(t, ctx, c, "replay the last hour through the candidate",
		chromedp.SetValue(css("#policy"), "# give timeouts two more retries\nnetwork_timeout:\n  max_retries: 4\n"),
		chromedp.SetValue(css("#hours"), "1"),
		chromedp.Click(css("#whatif-run")),
		chromedp.WaitVisible(css("#whatif-summary")),
		shot(t, "console-whatif.png"),
	)
	if got := text(t, ctx, c, "#whatif-disagreements"); got != "0" {
		t.Errorf("disagreements %q, want 0", got)
	}
	if got := text(t, ctx, c, "#whatif-changed"); got != fmt.Sprint(len(want)) {
		t.Errorf("changed %q, want %d", got, len(want))
	}
	changed := text(t, ctx, c, "#whatif-matrix tr.changed")
	if !strings.Contains(changed, "NETWORK_TIMEOUT") || !strings.Contains(changed, "DEADLETTER") || !strings.Contains(changed, "RETRY") {
		t.Errorf("the changed cell reads %q, want NETWORK_TIMEOUT DEADLETTER -> RETRY", changed)
	}
	list := text(t, ctx, c, "#whatif-changes tbody")
	for _, task := range want {
		if !strings.Contains(list, task) {
			t.Errorf("the changed decisions do not list %s:\n%s", task, list)
		}
	}

	// the same candidate uploaded as a file, the text box emptied: the
	// page shows the uploaded file and the same changed decisions
	file := filepath.Join(t.TempDir(), "candidate.yaml")
	if err := os.WriteFile(file, []byte("# uploaded\nnetwork_timeout:\n  max_retries: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, ctx, c, "upload the candidate as a file",
		chromedp.Clear(css("#policy")),
		chromedp.SetUploadFiles(css("#policy-file"), []string{file}),
		chromedp.SetValue(css("#hours"), "1"),
		// the report of the run before goes, so that the wait below is
		// for the new one
		chromedp.Evaluate[chromedp.Void](`document.querySelector("#whatif-summary").remove()`),
		chromedp.Click(css("#whatif-run")),
		chromedp.WaitVisible(css("#whatif-summary")),
	)
	if got, err := chromedp.Run(ctx, chromedp.Value(css("#policy"))); err != nil || !strings.Contains(got, "# uploaded") {
		t.Errorf("the page after the upload shows the candidate %q (%v), want the uploaded file", got, err)
	}
	if got := text(t, ctx, c, "#whatif-changed"); got != fmt.Sprint(len(want)) {
		t.Errorf("uploaded: changed %q, want %d", got, len(want))
	}
}
