package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/pkg/breaker"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const breakerSynopsis = `usage: faultrouter breaker reset --scope SCOPE --key KEY --reason TEXT [--operator NAME]
       faultrouter breaker latch --scope SCOPE --key KEY --reason TEXT [--operator NAME]

reset closes a circuit breaker by hand, for example the prompt template
breaker a MODEL_HALLUCINATION latched open: it ends every latch item written
before it (the hallucinations' review items stay open for their reviewers)
and none written after it, so a template that hallucinates again after the
reset is latched again.

latch latches a breaker open by hand, as a hallucination does, until a reset:
a cheap stop of a broken prompt template (or model, or downstream) while it
is fixed.

SCOPE is PROVIDER_MODEL (key provider/model), DOWNSTREAM (key: the event's
action) or PROMPT_TEMPLATE (key: the template). The reset or latch is one
record on the breakers topic, which every router instance applies in the
topic's order, written in one transaction with a command on every partition
of the decisions topic, which every instance audits with the operator's
name; each publishes its transition on the alerts topic.`

func breakerCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "reset" && args[0] != "latch") {
		fmt.Fprintln(stderr, breakerSynopsis)
		return errors.New("breaker: the subcommands are reset and latch")
	}
	verb := args[0]
	fs, g := newFlagSet("breaker "+verb, breakerSynopsis, stderr)
	var (
		scope    = fs.String("scope", "", "PROVIDER_MODEL, DOWNSTREAM or PROMPT_TEMPLATE (required)")
		key      = fs.String("key", "", "the breaker's key within its scope (required)")
		reason   = fs.String("reason", "", "why (required): it is audited with your name")
		operator = fs.String("operator", os.Getenv("USER"), "who resets or latches it")
	)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	sc, err := breaker.ParseScope(event.BreakerScope(*scope))
	switch {
	case err != nil:
		return fmt.Errorf("breaker %s: --scope %q: allowed PROVIDER_MODEL, DOWNSTREAM, PROMPT_TEMPLATE", verb, *scope)
	case *key == "":
		return fmt.Errorf("breaker %s: --key is required", verb)
	case *reason == "":
		return fmt.Errorf("breaker %s: --reason is required", verb)
	case *operator == "":
		return fmt.Errorf("breaker %s: --operator is required (USER is not set)", verb)
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	var topics control.Topics
	if topics.Decisions, err = g.topicName(topicspec.Decisions); err != nil {
		return err
	}
	if topics.Breakers, err = g.topicName(topicspec.Breakers); err != nil {
		return err
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	if err := g.requireTopics(ctx, "breaker "+verb, opts, topics.Decisions, topics.Breakers); err != nil {
		return err
	}
	var n int
	if verb == "latch" {
		n, err = control.LatchBreaker(ctx, opts, c, topics, control.Latch{Scope: sc, Key: *key, Reason: *reason, Operator: *operator})
	} else {
		n, err = control.ResetBreaker(ctx, opts, c, topics, control.Reset{Scope: sc, Key: *key, Reason: *reason, Operator: *operator})
	}
	if err != nil {
		return fmt.Errorf("breaker %s: %w", verb, err)
	}
	fmt.Fprintf(stdout, "%s of %s/%s written to %s and audited on %d partitions of %s\n", verb, sc, *key, topics.Breakers, n, topics.Decisions)
	return nil
}
