package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/advise"
	"github.com/faultrouter/faultrouter/internal/ledger"
	"github.com/faultrouter/faultrouter/internal/whatif"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/policy"
)

// demoAcmeTasks is how many tasks of the demo's stuck provider the stream
// holds: half of them clear on the first retry, the others time out three
// times, so that the advisor sees as many second retries as it needs
// (advise.Options.MinCount) and none of them succeeding.
const demoAcmeTasks = 60

// demoAdviceScript is the part of the demo's stream the advisor learns from:
// provider acme, whose timeouts never clear after the first retry, on its
// own action and template (its breakers are its own).
func demoAdviceScript(t0 time.Time) []event.TaskEvent {
	var evs []event.TaskEvent
	for i := range demoAcmeTasks {
		task := fmt.Sprintf("t-acme-%02d", i)
		attempts := 3
		if i%2 == 0 {
			attempts = 2
		}
		for n := 1; n <= attempts; n++ {
			e := event.TaskEvent{
				EventID: fmt.Sprintf("%s-e%d", task, n), TaskID: task, Attempt: int32(n),
				OccurredAt: event.At(t0.Add(time.Duration(i*100+n*3) * time.Millisecond * 10)),
				Source:     "summary-bot", Action: "summarize", Provider: "acme", Model: "acme-large", PromptTemplate: "summary-v2",
				Status: event.StatusError, Stage: event.StageNetwork,
				Error: &event.Error{Type: "TimeoutError", HTTPStatus: 504, Message: "upstream timed out"},
				Usage: event.Usage{CostUSD: 0.004, Tokens: 300, ElapsedMs: 1200},
			}
			if n == 2 && attempts == 2 {
				e.Status, e.Stage, e.Error = event.StatusOK, event.StageModel, nil
			}
			evs = append(evs, e)
		}
	}
	return evs
}

// demoAdvise ends the demo with the advisor: it reads the stream back as
// `faultrouter policy advise` does and prints its first proposal, the
// override it would add and the override's what-if.
func demoAdvise(ctx context.Context, seeds []kgo.Opt, t whatif.Topics, began time.Time, w io.Writer) error {
	res, err := advise.Run(ctx, seeds, t, advise.Options{Policy: policy.Default()},
		advise.RunOptions{Since: began, Until: time.Now().Add(time.Second), Idle: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("demo: advise: %w", err)
	}
	fmt.Fprintln(w, "\nPolicy advisor (faultrouter policy advise --since ... --out candidate.yaml):")
	if len(res.Proposals) == 0 {
		fmt.Fprintln(w, "  no proposal: nothing in the stream shows a pattern that enough observations support")
		return nil
	}
	p := res.Proposals[0]
	fmt.Fprintf(w, "  proposal:  %s\n", p.Change.Text)
	fmt.Fprintf(w, "  evidence:  %s\n", p.Evidence.Text)
	one, err := advise.Candidate(nil, res.Proposals[:1])
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "  as an override of the policy file:")
	for _, l := range strings.Split(strings.TrimRight(string(one), "\n"), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	if x := res.Whatif; x != nil {
		fmt.Fprintf(w, "  what-if:   %d retries -> %d; %d attempts fewer (%s), %d more; %d disagreements\n",
			x.Retries.Baseline, x.Retries.Candidate, x.Cost.RemovedAttempts, ledger.Dollars(x.Cost.RemovedUSD), x.Cost.AddedAttempts, x.Disagreements)
	}
	if n := len(res.Proposals) - 1; n > 0 {
		fmt.Fprintf(w, "  and %d more proposal(s): faultrouter policy advise lists them all\n", n)
	}
	return nil
}
