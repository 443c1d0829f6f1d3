package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/faultrouter/faultrouter/avro"
	"github.com/faultrouter/faultrouter/internal/control"
	"github.com/faultrouter/faultrouter/internal/registry"
	"github.com/faultrouter/faultrouter/pkg/codec"
	"github.com/faultrouter/faultrouter/pkg/event"
	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

const reviewSynopsis = `usage: faultrouter review decide --task ID (--approve | --reject) --reason TEXT [--reviewer NAME]

Writes a ReviewDecision to the decisions topic. Approving re-issues a retry of
the task with the same task_id; rejecting ends the task and puts the standard
message for the end user on its audit record.`

func reviewCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "decide" {
		fmt.Fprintln(stderr, reviewSynopsis)
		return errors.New("review: the only subcommand is decide")
	}
	fs, g := newFlagSet("review decide", reviewSynopsis, stderr)
	user := os.Getenv("USER")
	var (
		taskID   = fs.String("task", "", "task ID (required)")
		approve  = fs.Bool("approve", false, "approve: retry the task")
		reject   = fs.Bool("reject", false, "reject: end the task")
		reason   = fs.String("reason", "", "reason, shown to the end user on reject (required)")
		reviewer = fs.String("reviewer", user, "reviewer name")
	)
	regFlags := addRegistryFlags(fs, true)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch {
	case *taskID == "":
		return errors.New("review decide: --task is required")
	case *approve == *reject:
		return errors.New("review decide: give exactly one of --approve and --reject")
	case *reason == "":
		return errors.New("review decide: --reason is required")
	}
	d := event.ReviewDecision{TaskID: *taskID, Approve: *approve, Reason: *reason, Reviewer: *reviewer, At: event.At(time.Now())}
	c, err := codec.New()
	if err != nil {
		return err
	}
	name, err := g.topicName(topicspec.Decisions)
	if err != nil {
		return err
	}
	opts, err := g.clientOpts(nil)
	if err != nil {
		return err
	}
	wire, err := regFlags.wire()
	if err != nil {
		return fmt.Errorf("review decide: %w", err)
	}
	if err := g.requireTopics(ctx, "review decide", opts, name); err != nil {
		return err
	}
	var frame func(string, []byte) []byte
	if wire == registry.Confluent {
		if frame, err = regFlags.framer(ctx, c, name, avro.ReviewDecision); err != nil {
			return fmt.Errorf("review decide: %w", err)
		}
	}
	if err := control.DecideFramed(ctx, opts, c, name, frame, d); err != nil {
		return fmt.Errorf("review decide: %w", err)
	}
	verdict := "rejected"
	if d.Approve {
		verdict = "approved"
	}
	fmt.Fprintf(stdout, "%s %s: written to %s\n", verdict, d.TaskID, name)
	return nil
}
