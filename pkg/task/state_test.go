package task

import (
	"testing"

	"github.com/faultrouter/faultrouter/pkg/event"
)

// Guards what an operator's re-drive reopens: the task is no longer terminal,
// its review item is closed and its retry budget, rate-limit window and usage
// totals start afresh, while its history stays: attempts, the dedup set and
// the operations (a held write stays held).
func TestReopen(t *testing.T) {
	s := State{TaskID: "t", Attempts: 3, Retries: 2, RetriesByClass: map[event.Class]int32{event.ClassNetworkTimeout: 2},
		RateLimitedAt: []int64{1}, CostUSD: 0.4, Tokens: 900, ElapsedMs: 5000, Terminal: true, TerminalClass: event.ClassNetworkTimeout,
		Review: ReviewOpen, ReviewClass: event.ClassOutcomeUnknown, ReviewOwner: "ops", ReviewDueAt: 10, Pending: &PendingRetry{N: 2}}
	s.MarkSeen("e-1")
	s.AddOperation(Operation{OpID: "pay-1", Kind: event.OpWrite, State: event.OpUnknown})
	s.Reopen()
	if s.Terminal || s.TerminalClass != "" || s.Review != ReviewNone || s.ReviewOwner != "" || s.ReviewDueAt != 0 || s.Pending != nil {
		t.Fatalf("ending, review or pending retry kept: %+v", s)
	}
	if s.Retries != 0 || s.RetriesByClass != nil || s.RateLimitedAt != nil || s.CostUSD != 0 || s.Tokens != 0 || s.ElapsedMs != 0 {
		t.Fatalf("budgets not started afresh: %+v", s)
	}
	if s.Attempts != 3 || !s.Seen("e-1") || s.Op("pay-1") == nil || !s.Op("pay-1").Unknown() {
		t.Fatalf("history lost: %+v", s)
	}
}
