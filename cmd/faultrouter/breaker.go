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
)

const breakerSynopsis = `usage: faultrouter breaker reset --scope SCOPE --key KEY --reason TEXT [--operator NAME]

Closes a circuit breaker by hand, for example the prompt template breaker a
MODEL_HALLUCINATION latched open. SCOPE is PROVIDER_MODEL (key provider/model),
DOWNSTREAM (key: the event's action) or PROMPT_TEMPLATE (key: the template).
The command is written to every partition of the decisions topic, so every
router instance receives it; each audits it and publishes the transition on
the alerts topic.`

func breakerCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "reset" {
		fmt.Fprintln(stderr, breakerSynopsis)
		return errors.New("breaker: the only subcommand is reset")
	}
	fs, g := newFlagSet("breaker reset", breakerSynopsis, stderr)
	var (
		scope    = fs.String("scope", "", "PROVIDER_MODEL, DOWNSTREAM or PROMPT_TEMPLATE (required)")
		key      = fs.String("key", "", "the breaker's key within its scope (required)")
		reason   = fs.String("reason", "", "why it is safe to close (required)")
		operator = fs.String("operator", os.Getenv("USER"), "who resets it")
	)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	sc, err := breaker.ParseScope(*scope)
	switch {
	case err != nil:
		return fmt.Errorf("breaker reset: --scope %q: allowed PROVIDER_MODEL, DOWNSTREAM, PROMPT_TEMPLATE", *scope)
	case *key == "":
		return errors.New("breaker reset: --key is required")
	case *reason == "":
		return errors.New("breaker reset: --reason is required")
	}
	c, err := codec.New()
	if err != nil {
		return err
	}
	name, err := g.topicName("decisions")
	if err != nil {
		return err
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	n, err := control.ResetBreaker(ctx, opts, c, name, control.Reset{Scope: sc, Key: *key, Reason: *reason, Operator: *operator})
	if err != nil {
		return fmt.Errorf("breaker reset: %w", err)
	}
	fmt.Fprintf(stdout, "reset of %s/%s written to %d partitions of %s\n", sc, *key, n, name)
	return nil
}
