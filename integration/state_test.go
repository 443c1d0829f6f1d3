package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Task-state contracts on the real broker, driven through the CLI
// (produce, review decide, taskid) and observed through tail.

const (
	stateOpTimeout = `"status":"ERROR","stage":"BUSINESS","error":{"type":"TimeoutError","message":"no receipt from the payments API"}`
	stateRateLimit = `"status":"ERROR","stage":"PROTOCOL","error":{"type":"RateLimitError","http_status":429,"retry_after_ms":500}`
	stateAuth      = `"status":"ERROR","stage":"PROTOCOL","error":{"type":"AuthenticationError","http_status":401,"code":"token_expired"}`
	stateCode1001  = `"status":"ERROR","stage":"BUSINESS","error":{"type":"ValidationError","code":"CODE_1001","message":"date is not ISO 8601"}`
	stateCode2001  = `"status":"ERROR","stage":"BUSINESS","error":{"type":"ValidationError","code":"CODE_2001","message":"total does not match the items"}`
)

// stateOp returns the fields of an event serving a WRITE operation.
func stateOp(fields, opID, params, state string) string {
	return fields + fmt.Sprintf(`,"operation":{"op_id":%q,"kind":"WRITE","params_sha256":%q,"state":%q}`, opID, params, state)
}

// stateAudit waits until the task has at least n audit records and returns them.
func stateAudit(e *env, taskID string, n int) []map[string]any {
	e.t.Helper()
	recs := byTask(e.tailUntil("audit", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, taskID)) >= n }), taskID)
	if len(recs) < n {
		e.t.Fatalf("%s: %d audit records, want %d: %v", taskID, len(recs), n, recs)
	}
	return recs
}

// stateRoute is "CLASS/ROUTE (rule)" of a routed or audit record.
func stateRoute(r map[string]any) string {
	return str(r, "decision.class") + "/" + str(r, "decision.route") + " (" + str(r, "decision.rule") + ")"
}

// stateMetric reads one unlabelled counter from the router's /metrics.
func stateMetric(t *testing.T, rt *router, name string) float64 {
	t.Helper()
	v, ok := scrape(t, rt.metrics, name)
	if !ok {
		t.Fatalf("metric %s not exposed", name)
	}
	return v
}

// Guards dedup: an exact redelivery (same event_id) is
// routed once; every copy gets its audit record, the copies DROP with rule
// dedup.redelivery, and they are counted in
// faultrouter_redeliveries_dropped_total. Covered in one batch (two copies
// produced together) and across batches (a copy produced later, read back
// from Pebble).
func TestStateSameEventTwiceIsRoutedOnce(t *testing.T) {
	e := newEnv(t)
	rt := e.startRouter("a", t.TempDir())

	e.cli(taskEvent("dup-1", "t-dup", 1, refusalFields)+taskEvent("dup-1", "t-dup", 1, refusalFields)+
		taskEvent("dupn-1", "t-dup-net", 1, timeoutFields)+taskEvent("dupn-1", "t-dup-net", 1, timeoutFields),
		"produce", "--topic", "ingress")
	stateAudit(e, "t-dup", 2)
	e.cli(taskEvent("dup-1", "t-dup", 1, refusalFields), "produce", "--topic", "ingress")

	audit := stateAudit(e, "t-dup", 3)
	if len(audit) != 3 {
		t.Fatalf("t-dup: %d audit records, want 3", len(audit))
	}
	if got := str(audit[0], "decision.class") + "/" + str(audit[0], "decision.route"); got != "MODEL_REFUSAL/REVIEW" {
		t.Errorf("t-dup first copy: %s, want MODEL_REFUSAL/REVIEW", got)
	}
	for i, r := range audit[1:] {
		if got := stateRoute(r); got != "MODEL_REFUSAL/DROP (dedup.redelivery)" {
			t.Errorf("t-dup copy %d: %s, want MODEL_REFUSAL/DROP (dedup.redelivery)", i+2, got)
		}
	}
	if n, _ := get(audit[2], "decision.totals.attempts").(float64); n != 1 {
		t.Errorf("after two redeliveries the task has %v attempts, want 1", get(audit[2], "decision.totals.attempts"))
	}
	net := stateAudit(e, "t-dup-net", 2)
	if len(net) != 2 || str(net[0], "decision.route") != "RETRY" || str(net[1], "decision.rule") != "dedup.redelivery" {
		t.Errorf("t-dup-net audit: %v, want RETRY then DROP", net)
	}

	// the one retry becomes due after 1 s; a second one would be published in
	// the same transaction or later, so wait for the first and look again
	retries := byTask(e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-dup-net")) >= 1 }), "t-dup-net")
	if len(retries) != 1 {
		t.Fatalf("retry topic: %d records for t-dup-net, want 1", len(retries))
	}
	if got := byTask(e.tail("review", 2*time.Second), "t-dup"); len(got) != 1 {
		t.Errorf("review topic: %d records for t-dup, want 1 (routed once)", len(got))
	}
	if got := byTask(e.tail("retry", 3*time.Second), "t-dup-net"); len(got) != 1 {
		t.Errorf("retry topic, later: %d records for t-dup-net, want 1", len(got))
	}
	if n := stateMetric(t, rt, "faultrouter_redeliveries_dropped_total"); n != 3 {
		t.Errorf("faultrouter_redeliveries_dropped_total = %v, want 3", n)
	}
}

// Guards the second half of dedup: any event for a task already terminal
// (completed, or ended in review) is DUPLICATE_EXECUTION, audit only: no
// retry, no review item, no dead letter, and the task's ending stays.
func TestStateEventForTerminalTaskIsDuplicateExecution(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())

	e.cli(taskEvent("done-1", "t-done", 1, okFields)+taskEvent("done-2", "t-done", 2, timeoutFields)+
		taskEvent("rev-1", "t-reviewed", 1, refusalFields)+taskEvent("rev-2", "t-reviewed", 2, refusalFields)+
		taskEvent("rev-3", "t-reviewed", 3, okFields), "produce", "--topic", "ingress")

	want := map[string][]string{
		"t-done":     {"SUCCEEDED/COMPLETE", "DUPLICATE_EXECUTION/COMPLETE (duplicate_execution.terminal_task)"},
		"t-reviewed": {"MODEL_REFUSAL/REVIEW", "DUPLICATE_EXECUTION/COMPLETE (duplicate_execution.terminal_task)", "DUPLICATE_EXECUTION/COMPLETE (duplicate_execution.terminal_task)"},
	}
	for task, routes := range want {
		audit := stateAudit(e, task, len(routes))
		if len(audit) != len(routes) {
			t.Fatalf("%s: %d audit records, want %d", task, len(audit), len(routes))
		}
		for i, r := range audit {
			got := stateRoute(r)
			if i == 0 { // the first decision: class and route are the contract here
				got = str(r, "decision.class") + "/" + str(r, "decision.route")
			}
			if got != routes[i] {
				t.Errorf("%s audit %d: %s, want %s (reason %q)", task, i, got, routes[i], str(r, "decision.reason"))
			}
		}
	}
	if got := byTask(e.tail("review", 2*time.Second), "t-reviewed"); len(got) != 1 {
		t.Errorf("review topic: %d items for t-reviewed, want only the first", len(got))
	}
	for _, topic := range []string{"retry", "deadletter"} {
		for _, task := range []string{"t-done", "t-reviewed"} {
			if got := byTask(e.tail(topic, 2*time.Second), task); len(got) != 0 {
				t.Errorf("%s topic: %d records for %s, want none", topic, len(got), task)
			}
		}
	}
}

// Guards the review loop-back through `faultrouter review
// decide`: approving an open item produces exactly one retry with the same
// task_id and audits MANUAL_OVERRIDE_SUCCESS (a second approval finds no open
// item and changes nothing); rejecting makes the task terminal, audits
// MANUAL_REJECTED and puts the end-user message in English and Chinese on the
// audit record; a decision for an unknown task is audited and changes nothing.
func TestStateReviewDecisions(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())

	e.cli(taskEvent("appr-1", "t-approve", 1, refusalFields)+taskEvent("rej-1", "t-reject", 1, refusalFields),
		"produce", "--topic", "ingress")
	stateAudit(e, "t-approve", 1)
	stateAudit(e, "t-reject", 1)

	e.cli("", "review", "decide", "--task", "t-approve", "--approve", "--reason", "the answer is right", "--reviewer", "it")
	audit := stateAudit(e, "t-approve", 2)
	if got := stateRoute(audit[1]); got != "MODEL_REFUSAL/RETRY (MANUAL_OVERRIDE_SUCCESS)" {
		t.Errorf("approve: audit %s, want MODEL_REFUSAL/RETRY (MANUAL_OVERRIDE_SUCCESS)", got)
	}
	retries := byTask(e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-approve")) >= 1 }), "t-approve")
	if len(retries) != 1 || str(retries[0], "event_id") != "appr-1" || str(retries[0], "decision.rule") != "MANUAL_OVERRIDE_SUCCESS" {
		t.Fatalf("retry topic after approve: %v, want one retry re-issuing appr-1 with task_id t-approve", retries)
	}

	// the same approval again: the item is closed, nothing happens
	e.cli("", "review", "decide", "--task", "t-approve", "--approve", "--reason", "clicked twice", "--reviewer", "it")
	audit = stateAudit(e, "t-approve", 3)
	if got := stateRoute(audit[2]); !strings.HasSuffix(got, "/DROP (review.no_open_item)") {
		t.Errorf("second approve: audit %s, want DROP (review.no_open_item)", got)
	}

	e.cli("", "review", "decide", "--task", "t-reject", "--reject", "--reason", "the scan is unreadable", "--reviewer", "it")
	audit = stateAudit(e, "t-reject", 2)
	if got := stateRoute(audit[1]); got != "MODEL_REFUSAL/COMPLETE (MANUAL_REJECTED)" {
		t.Errorf("reject: audit %s, want MODEL_REFUSAL/COMPLETE (MANUAL_REJECTED)", got)
	}
	msg := str(audit[1], "decision.user_message")
	for _, want := range []string{
		"Your submission has a problem: the scan is unreadable. Please correct it and submit again.",
		"您的材料存在the scan is unreadable问题，请修正后重新提交",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("reject: user_message %q lacks %q", msg, want)
		}
	}
	// rejected is terminal: a later event is a duplicate execution
	e.cli(taskEvent("rej-2", "t-reject", 2, okFields), "produce", "--topic", "ingress")
	audit = stateAudit(e, "t-reject", 3)
	if got := str(audit[2], "decision.class"); got != "DUPLICATE_EXECUTION" {
		t.Errorf("event after reject: class %s, want DUPLICATE_EXECUTION", got)
	}

	e.cli("", "review", "decide", "--task", "t-nobody", "--reject", "--reason", "no such item", "--reviewer", "it")
	var unknown []map[string]any
	e.tailUntil("audit", 60*time.Second, func(recs []map[string]any) bool {
		unknown = nil
		for _, r := range recs {
			if strings.HasSuffix(str(r, "input.topic"), "review.decisions") && strings.Contains(str(r, "decision.reason"), "t-nobody") {
				unknown = append(unknown, r)
			}
		}
		return len(unknown) >= 1
	})
	if len(unknown) != 1 || str(unknown[0], "decision.route") != "DROP" || str(unknown[0], "decision.rule") != "review.no_open_item" {
		t.Fatalf("decision for an unknown task: audit %v, want one DROP (review.no_open_item)", unknown)
	}
	for _, topic := range []string{"retry", "review", "deadletter"} {
		for _, r := range e.tail(topic, 2*time.Second) {
			if str(r, "task_id") == "t-nobody" || strings.Contains(str(r, "decision.reason"), "t-nobody") {
				t.Errorf("%s topic has a record for the unknown task: %v", topic, r)
			}
		}
	}
	if got := byTask(e.tail("retry", 2*time.Second), "t-approve"); len(got) != 1 {
		t.Errorf("retry topic at the end: %d records for t-approve, want exactly 1", len(got))
	}
}

// Guards unknown outcomes: a WRITE operation SUBMITTED with
// no receipt is OUTCOME_UNKNOWN, held in review and never retried; a receipt
// for another op_id with the same params_sha256 does not resolve it (two
// separately authorized operations stay distinct, and that is no
// PARAMS_MISMATCH either); the CONFIRMED receipt for the same op_id completes
// the task.
func TestStateUnknownOutcomeThenReceipt(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())
	const params = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

	e.cli(taskEvent("op-1", "t-refund", 1, stateOp(stateOpTimeout, "op-A", params, "SUBMITTED")), "produce", "--topic", "ingress")
	audit := stateAudit(e, "t-refund", 1)
	if got := stateRoute(audit[0]); got != "OUTCOME_UNKNOWN/REVIEW (outcome_unknown.hold)" {
		t.Fatalf("submitted without receipt: %s, want OUTCOME_UNKNOWN/REVIEW (outcome_unknown.hold)", got)
	}

	e.cli(taskEvent("op-2", "t-refund", 2, stateOp(okFields, "op-B", params, "CONFIRMED")), "produce", "--topic", "ingress")
	audit = stateAudit(e, "t-refund", 2)
	if got := stateRoute(audit[1]); strings.Contains(got, "outcome_unknown.confirmed") || strings.HasPrefix(got, "PARAMS_MISMATCH") {
		t.Errorf("receipt for op-B (same params as op-A): %s; it must neither resolve op-A nor be a params mismatch", got)
	}

	e.cli(taskEvent("op-3", "t-refund", 3, stateOp(okFields, "op-A", params, "CONFIRMED")), "produce", "--topic", "ingress")
	audit = stateAudit(e, "t-refund", 3)
	if got := stateRoute(audit[2]); got != "SUCCEEDED/COMPLETE (outcome_unknown.confirmed)" {
		t.Errorf("receipt for op-A: %s, want SUCCEEDED/COMPLETE (outcome_unknown.confirmed)", got)
	}
	if got := byTask(e.tail("retry", 2*time.Second), "t-refund"); len(got) != 0 {
		t.Errorf("an operation with an unknown outcome was retried: %v", got)
	}
}

// Guards the shared retry budget (default retry_budget 4):
// retries of one task across classes (a timeout, a 429 with retry_after_ms,
// an auth failure, a CODE_1xxx validation failure), each within its own
// class limit, stop at 4 in total; the fifth retriable failure is dead-
// lettered with rule budget.retries_exhausted and the totals show 4 retries.
func TestStateSharedRetryBudget(t *testing.T) {
	e := newEnv(t)
	e.startRouter("a", t.TempDir())

	steps := []struct {
		fields, class string
		delayMs       int
	}{
		{timeoutFields, "NETWORK_TIMEOUT", 1000},
		{stateRateLimit, "RATE_LIMITED", 500},
		{stateAuth, "AUTH_FAILED", 0},
		{stateCode1001, "VALIDATION_FIXABLE", 0},
	}
	// the worker waits for each retry before its next attempt
	for i, s := range steps {
		e.cli(taskEvent(fmt.Sprintf("bud-%d", i+1), "t-budget", i+1, s.fields), "produce", "--topic", "ingress")
		retries := byTask(e.tailUntil("retry", 60*time.Second, func(r []map[string]any) bool { return len(byTask(r, "t-budget")) >= i+1 }), "t-budget")
		if len(retries) != i+1 {
			t.Fatalf("after attempt %d (%s): %d retries, want %d", i+1, s.class, len(retries), i+1)
		}
		r := retries[i]
		if str(r, "decision.class") != s.class {
			t.Errorf("retry %d: class %s, want %s", i+1, str(r, "decision.class"), s.class)
		}
		if n, _ := get(r, "decision.retry.n").(float64); int(n) != i+1 {
			t.Errorf("retry %d: n = %v", i+1, get(r, "decision.retry.n"))
		}
		if d, _ := get(r, "decision.retry.delay_ms").(float64); int(d) != s.delayMs {
			t.Errorf("retry %d (%s): delay %v ms, want %d", i+1, s.class, get(r, "decision.retry.delay_ms"), s.delayMs)
		}
	}
	e.cli(taskEvent("bud-5", "t-budget", 5, stateCode2001), "produce", "--topic", "ingress")
	audit := stateAudit(e, "t-budget", 5)
	last := audit[4]
	if got := stateRoute(last); got != "VALIDATION_FIXABLE/DEADLETTER (budget.retries_exhausted)" {
		t.Errorf("fifth failure: %s, want VALIDATION_FIXABLE/DEADLETTER (budget.retries_exhausted)", got)
	}
	if n, _ := get(last, "decision.totals.retries").(float64); n != 4 {
		t.Errorf("totals.retries = %v, want 4", get(last, "decision.totals.retries"))
	}
	if got := byTask(e.tail("deadletter", 2*time.Second), "t-budget"); len(got) != 1 {
		t.Errorf("deadletter: %d records for t-budget, want 1", len(got))
	}
	if got := byTask(e.tail("retry", 2*time.Second), "t-budget"); len(got) != 4 {
		t.Errorf("retry topic: %d records for t-budget, want 4", len(got))
	}
}

// Guards deterministic task IDs through the CLI: the same
// content, user and action give a byte-identical ID; one changed byte of
// content gives another; --authorization separates two separately approved
// identical operations; the user and the action are part of the identity.
func TestStateTaskIDCLI(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.pdf"), filepath.Join(dir, "b.pdf")
	content := []byte("%PDF-1.7 refund request #1234 for 49.90 EUR")
	changed := append([]byte{}, content...)
	changed[len(changed)-1] ^= 0x01
	if err := os.WriteFile(a, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(b, changed, 0o600); err != nil {
		t.Fatal(err)
	}
	id := func(args ...string) string {
		return strings.TrimSpace(e.cli("", append([]string{"taskid"}, args...)...))
	}
	first := id("--file", a, "--user", "u-42", "--action", "refund")
	if first == "" {
		t.Fatal("taskid printed nothing")
	}
	if again := id("--file", a, "--user", "u-42", "--action", "refund"); again != first {
		t.Errorf("same input twice: %q then %q", first, again)
	}
	for name, args := range map[string][]string{
		"one changed byte": {"--file", b, "--user", "u-42", "--action", "refund"},
		"authorization 1":  {"--file", a, "--user", "u-42", "--action", "refund", "--authorization", "appr-1"},
		"other user":       {"--file", a, "--user", "u-43", "--action", "refund"},
		"other action":     {"--file", a, "--user", "u-42", "--action", "contract_review"},
	} {
		if got := id(args...); got == first || got == "" {
			t.Errorf("%s: ID %q, want one different from %q", name, got, first)
		}
	}
	auth1 := id("--file", a, "--user", "u-42", "--action", "refund", "--authorization", "appr-1")
	auth2 := id("--file", a, "--user", "u-42", "--action", "refund", "--authorization", "appr-2")
	if auth1 == auth2 {
		t.Errorf("two authorizations of the same operation share the ID %q", auth1)
	}
	if again := id("--file", a, "--user", "u-42", "--action", "refund", "--authorization", "appr-1"); again != auth1 {
		t.Errorf("same authorization twice: %q then %q", auth1, again)
	}
}
