package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
)

// replayProduce produces recs synchronously with a plain client.
func replayProduce(t *testing.T, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// replayJSON runs replay with --format json and returns the lines and stderr.
func (e *env) replayJSON(args ...string) ([]map[string]any, string) {
	e.t.Helper()
	out, errOut, err := e.tryCLI("", append([]string{"replay", "--format", "json"}, args...)...)
	if err != nil {
		e.t.Fatalf("replay %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, errOut)
	}
	return parseLines(e.t, out), errOut
}

// Guards replay's time range (docs/design.md, command line): --since and
// --until are located with offsets-for-times, so records before the range are
// never read (the consumer starts at the found offset) and records at or after
// --until are not printed.
func TestReplayTimeRangeReadsOnlyTheRange(t *testing.T) {
	e := newEnv(t)
	e.cli("", "topics", "apply", "--partitions", "3")
	c, err := codec.New()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rec := func(id string, at time.Time) *kgo.Record {
		ev := event.TaskEvent{EventID: id, TaskID: "t-range", Attempt: 1, OccurredAt: event.At(at), Source: "it", Action: "answer_ticket",
			Status: event.StatusOK, Usage: event.Usage{CostUSD: 0.01, Tokens: 10, ElapsedMs: 5}}
		v, err := c.EncodeTaskEvent(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: e.prefix + "ai.tasks.ingress", Key: []byte("t-range"), Value: v, Timestamp: at}
	}
	// one key, so one partition: offsets 0-2 before the range, 3-5 inside it, 6-7 after it
	var recs []*kgo.Record
	for i := range 3 {
		recs = append(recs, rec(fmt.Sprintf("old-%d", i), now.Add(-3*time.Hour).Add(time.Duration(i)*time.Second)))
	}
	for i := range 3 {
		recs = append(recs, rec(fmt.Sprintf("in-%d", i), now.Add(-time.Hour).Add(time.Duration(i)*time.Second)))
	}
	for i := range 2 {
		recs = append(recs, rec(fmt.Sprintf("new-%d", i), now.Add(-time.Minute).Add(time.Duration(i)*time.Second)))
	}
	replayProduce(t, recs...)
	part := recs[0].Partition

	lines, stderr := e.replayJSON("--topic", "ingress", "--since", "-2h", "--until", "-30m")
	var ids []string
	for _, l := range lines {
		ids = append(ids, str(l, "event_id"))
	}
	if strings.Join(ids, ",") != "in-0,in-1,in-2" {
		t.Fatalf("replay printed %v, want in-0,in-1,in-2\nstderr:\n%s", ids, stderr)
	}
	want := fmt.Sprintf("ai.tasks.ingress/%d: start offset 3, end offset 6 (3 to read)", part)
	if !strings.Contains(stderr, want) {
		t.Fatalf("stderr does not report the located offsets %q:\n%s", want, stderr)
	}
	if !strings.Contains(stderr, "replay: 3 records read, 3 matched") {
		t.Fatalf("replay read more than the range (want 3 records read):\n%s", stderr)
	}
	// an RFC 3339 range and a filter that matches nothing in it
	lines, stderr = e.replayJSON("--topic", e.prefix+"ai.tasks.ingress", "--since", now.Add(-4*time.Hour).UTC().Format(time.RFC3339),
		"--until", now.Add(-2*time.Hour).UTC().Format(time.RFC3339), "--task", "t-range")
	if len(lines) != 3 || str(lines[0], "event_id") != "old-0" || !strings.Contains(stderr, "3 records read") {
		t.Fatalf("RFC 3339 range: %d lines %v\nstderr:\n%s", len(lines), lines, stderr)
	}
}

// Guards `replay --task ID --timeline` and re-drive: the story of a
// task retried twice and dead-lettered across ingress, audit, retry and dead
// letter in time order with decisions and reasons; a dry run prints the
// re-drive and sends nothing; the re-drive sends exactly the selected record,
// once, with lineage headers naming the operator (--operator, else the
// account running the CLI, as the console names its signed-in person).
func TestReplayTimelineAndRedrive(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	e.cli(taskEvent("net-1", "t-net", 1, timeoutFields), "produce", "--topic", "ingress")
	for n := 1; n <= 2; n++ {
		e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-net")) >= n })
		e.cli(taskEvent(fmt.Sprintf("net-%d", n+1), "t-net", n+1, timeoutFields), "produce", "--topic", "ingress")
	}
	e.tailUntil("deadletter", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-net")) >= 1 })

	var steps []map[string]any
	waitFor(30*time.Second, func() bool {
		steps, _ = e.replayJSON("--task", "t-net", "--timeline")
		return len(steps) >= 9
	})
	var got []string
	for _, s := range steps {
		short := strings.TrimPrefix(str(s, "record.topic"), e.prefix+"ai.tasks.")
		step := short
		if c := str(s, "decision.class"); c != "" {
			step += ":" + c + "/" + str(s, "decision.route")
			if str(s, "decision.reason") == "" {
				t.Errorf("step %s has no reason: %v", step, s)
			}
		}
		got = append(got, step)
	}
	// the audit record and the routed record of one input are written in one
	// transaction; the next attempt follows the retry
	want := []string{
		"ingress", "audit:NETWORK_TIMEOUT/RETRY", "retry:NETWORK_TIMEOUT/RETRY",
		"ingress", "audit:NETWORK_TIMEOUT/RETRY", "retry:NETWORK_TIMEOUT/RETRY",
		"ingress", "audit:NETWORK_TIMEOUT/DEADLETTER", "deadletter:NETWORK_TIMEOUT/DEADLETTER",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("timeline\n got %v\nwant %v", got, want)
	}
	table := e.cli("", "replay", "--task", "t-net", "--timeline")
	if !strings.HasPrefix(table, "TIME") || !strings.Contains(table, "NETWORK_TIMEOUT -> DEADLETTER") || strings.Count(table, "\n") != 10 {
		t.Fatalf("timeline table:\n%s", table)
	}

	ingressOf := func() []map[string]any {
		l, _ := e.replayJSON("--topic", "ingress", "--task", "t-net")
		return l
	}
	if n := len(ingressOf()); n != 3 {
		t.Fatalf("ingress has %d records of t-net before the re-drive, want 3", n)
	}
	out, stderr, err := e.tryCLI("", "replay", "--topic", "deadletter", "--task", "t-net", "--redrive-to", "ingress", "--dry-run")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, stderr)
	}
	dry := parseLines(t, out)
	// without --operator, the operator is the account running the CLI
	if len(dry) != 1 || get(dry[0], "dry_run") != true || str(dry[0], "event.event_id") != "net-3" || !strings.Contains(stderr, "nothing sent") ||
		str(dry[0], "operator") == "" {
		t.Fatalf("dry run printed %v\nstderr:\n%s", dry, stderr)
	}
	if n := len(ingressOf()); n != 3 {
		t.Fatalf("the dry run sent something: ingress has %d records of t-net, want 3", n)
	}

	dl, _ := e.replayJSON("--topic", "deadletter", "--task", "t-net")
	src := dl[0]["record"].(map[string]any)
	_, stderr, err = e.tryCLI("", "replay", "--topic", "deadletter", "--task", "t-net", "--redrive-to", "ingress", "--operator", "carol")
	if err != nil || !strings.Contains(stderr, "re-drove 1 record(s)") {
		t.Fatalf("re-drive: %v\n%s", err, stderr)
	}
	var ing []map[string]any
	waitFor(30*time.Second, func() bool { ing = ingressOf(); return len(ing) >= 4 })
	if len(ing) != 4 {
		t.Fatalf("ingress has %d records of t-net after one re-drive, want 4", len(ing))
	}
	re := ing[3]
	lin, _ := get(re, "record.redrive").(map[string]any)
	if str(re, "event_id") != "net-3" || lin["count"] != "1" || lin["source.topic"] != src["topic"] ||
		lin["source.partition"] != strconv.Itoa(int(src["partition"].(float64))) || lin["source.offset"] != strconv.Itoa(int(src["offset"].(float64))) || lin["operator"] != "carol" {
		t.Fatalf("re-driven record %v, want event net-3 with lineage of %v", re, src)
	}
	for _, r := range ing[:3] {
		if get(r, "record.redrive") != nil {
			t.Fatalf("an original record carries lineage: %v", r)
		}
	}

	// The router's decision on the re-driven event, read from the audit
	// topic: a re-drive is an operator's instruction, not a redelivery of
	// net-3, so the task is reopened and the timeout is retried afresh
	// (before, it was dropped as an exact redelivery).
	var audit []map[string]any
	e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { audit = byTask(r, "t-net"); return len(audit) >= 4 })
	if len(audit) != 4 {
		t.Fatalf("%d audit records of t-net after the re-drive, want 4", len(audit))
	}
	last := audit[3]
	if str(last, "event_id") != "net-3" || str(last, "decision.class") != "NETWORK_TIMEOUT" || str(last, "decision.route") != "RETRY" ||
		!strings.Contains(str(last, "decision.reason"), "re-drive 1 of "+str(src, "topic")) {
		t.Fatalf("the re-driven event was decided %s/%s (%s), want NETWORK_TIMEOUT/RETRY naming the re-drive",
			str(last, "decision.class"), str(last, "decision.route"), str(last, "decision.reason"))
	}
	// and the fresh retry is published when due, with the lineage
	retries := e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-net")) >= 3 })
	if n := len(byTask(retries, "t-net")); n != 3 {
		t.Fatalf("%d retries of t-net after the re-drive, want 3 (2 before, 1 after)", n)
	}
}

// Guards the re-drive of a write whose outcome is unknown: replay refuses it
// unless the operator gives --force and --reason (running it again may pay a
// refund twice); forced, it reaches the router as an operator's instruction,
// and the router still holds the write for reconciliation (it never retries
// it), with the re-drive and its reason named in the audit record.
func TestReplayRedriveOfUnknownOutcomeNeedsForceAndReason(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	write := `"status":"ERROR","stage":"BUSINESS","error":{"type":"TimeoutError","message":"no receipt"},` +
		`"operation":{"op_id":"refund-7","kind":"WRITE","params_sha256":"ab12","state":"UNKNOWN"}`
	e.cli(taskEvent("pay-1", "t-pay", 1, write), "produce", "--topic", "ingress")
	e.tailUntil("review", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-pay")) >= 1 })

	redrive := []string{"replay", "--topic", "review", "--task", "t-pay", "--redrive-to", "ingress"}
	out, stderr, err := e.tryCLI("", redrive...)
	if err != nil || strings.TrimSpace(out) != "" || !strings.Contains(stderr, "outcome is unknown") || !strings.Contains(stderr, "nothing to re-drive") {
		t.Fatalf("re-drive without --force was not refused: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	if _, stderr, err := e.tryCLI("", append(redrive, "--force")...); err == nil || !strings.Contains(stderr, "--force needs --reason") {
		t.Fatalf("--force without --reason: %v\n%s", err, stderr)
	}
	_, stderr, err = e.tryCLI("", append(redrive, "--force", "--reason", "ledger checked: refund-7 not paid")...)
	if err != nil || !strings.Contains(stderr, "re-drove 1 record(s)") {
		t.Fatalf("forced re-drive: %v\n%s", err, stderr)
	}
	var audit []map[string]any
	e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { audit = byTask(r, "t-pay"); return len(audit) >= 2 })
	if len(audit) != 2 {
		t.Fatalf("%d audit records of t-pay, want 2", len(audit))
	}
	d := audit[1]
	reason := str(d, "decision.reason")
	if str(d, "decision.class") != "OUTCOME_UNKNOWN" || str(d, "decision.route") != "REVIEW" ||
		!strings.Contains(reason, "re-drive 1 of") || !strings.Contains(reason, "forced") || !strings.Contains(reason, "ledger checked") {
		t.Fatalf("the forced re-drive was decided %s/%s (%s), want OUTCOME_UNKNOWN/REVIEW naming the forced re-drive and its reason",
			str(d, "decision.class"), str(d, "decision.route"), reason)
	}
	if retries := byTask(e.tailNow("retry"), "t-pay"); len(retries) != 0 {
		t.Fatalf("a write whose outcome is unknown was retried: %v", retries)
	}
}

// Guards the re-drive loop guard: a raw poison input dead-lettered
// by the router, re-driven, dead-lettered again... carries its re-drive count
// through the router; after 3 re-drives the next one is refused and says so,
// and nothing is sent.
func TestReplayLoopGuardRefusesAfterThreeRedrives(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	replayProduce(t, &kgo.Record{Topic: e.prefix + "ai.tasks.ingress", Key: []byte("t-poison"), Value: []byte("not avro at all")})
	deadOf := func() []map[string]any {
		l, _ := e.replayJSON("--topic", "deadletter", "--task", "t-poison")
		return l
	}
	var (
		dead  []map[string]any
		since time.Time
	)
	for n := 0; n <= 3; n++ {
		if !waitFor(60*time.Second, func() bool { dead = deadOf(); return len(dead) >= n+1 }) || len(dead) != n+1 {
			t.Fatalf("after %d re-drives: %d dead letters of t-poison, want %d", n, len(dead), n+1)
		}
		last := dead[n]
		if c, _ := get(last, "record.redrive.count").(string); n > 0 && c != strconv.Itoa(n) {
			t.Fatalf("dead letter %d carries re-drive count %q, want %d: %v", n, c, n, last)
		}
		// select only the newest dead letter, as an operator would by time
		since, _ = time.Parse(time.RFC3339Nano, str(last, "record.timestamp"))
		args := []string{"replay", "--topic", "deadletter", "--task", "t-poison", "--since", since.UTC().Format(time.RFC3339Nano), "--redrive-to", "ingress"}
		out, stderr, err := e.tryCLI("", args...)
		if err != nil {
			t.Fatalf("re-drive %d: %v\n%s", n+1, err, stderr)
		}
		if n < 3 {
			if !strings.Contains(stderr, "re-drove 1 record(s)") {
				t.Fatalf("re-drive %d did not send one record:\n%s\n%s", n+1, out, stderr)
			}
			continue
		}
		if !strings.Contains(stderr, "already re-driven 3 times (--max-redrives 3)") || strings.TrimSpace(out) != "" || !strings.Contains(stderr, "nothing to re-drive") {
			t.Fatalf("the fourth re-drive was not refused:\nstdout:\n%s\nstderr:\n%s", out, stderr)
		}
	}
	// the refused re-drive sent nothing: 1 original + 3 re-driven copies on ingress
	raw, _ := e.replayJSON("--topic", "ingress", "--task", "t-poison")
	if len(raw) != 4 {
		t.Fatalf("ingress has %d records of t-poison, want 4", len(raw))
	}
	// a higher limit lets an operator go on, deliberately
	_, stderr, err := e.tryCLI("", "replay", "--topic", "deadletter", "--task", "t-poison", "--since", since.UTC().Format(time.RFC3339Nano),
		"--redrive-to", "ingress", "--max-redrives", "5", "--dry-run")
	if err != nil || !strings.Contains(stderr, "would re-drive 1 record(s)") {
		t.Fatalf("--max-redrives 5: %v\n%s", err, stderr)
	}
}
