package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/internal/replay"
	"github.com/faultrouter/faultrouter/internal/router"
	"github.com/faultrouter/faultrouter/pkg/policy"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// demoCost prints the demo's cost table, read back from the audit topic as
// `faultrouter cost` reads it, and with a candidate policy the what-if of
// the stream against the default policy the demo ran with.
func demoCost(ctx context.Context, seeds []kgo.Opt, cfg router.Config, began time.Time, candidate *policy.Policy, w io.Writer) error {
	rng := replay.Range{Since: began, Until: time.Now().Add(time.Second)}
	rep, err := costReport(ctx, seeds, cfg.Topics.Audit, rng, policy.Default(), 10*time.Second, io.Discard)
	if err != nil {
		return fmt.Errorf("demo: cost: %w", err)
	}
	fmt.Fprintln(w, "\nCost of the stream (faultrouter cost --since ...):")
	if err := rep.WriteTable(w, 5); err != nil {
		return err
	}
	if candidate == nil {
		return nil
	}
	fmt.Fprintln(w, "\nWhat-if (faultrouter policy whatif --policy CANDIDATE --since ...):")
	names := map[topicspec.Short]string{topicspec.Ingress: cfg.Topics.Ingress, topicspec.Decisions: cfg.Topics.Decisions, topicspec.Audit: cfg.Topics.Audit}
	wr, err := runWhatif(ctx, seeds, names, rng, policy.Default(), candidate, 3, 10*time.Second, io.Discard)
	if err != nil {
		return fmt.Errorf("demo: whatif: %w", err)
	}
	return wr.WriteTable(w)
}
