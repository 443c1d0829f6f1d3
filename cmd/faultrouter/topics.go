package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// topicsUsage is the synopsis of the topics verb.
const topicsUsage = "usage: faultrouter topics apply|check [--partitions N] [--replication-factor RF]"

// topicsCommand runs `topics apply` (create the topics of set that the cluster
// lacks) and `topics check` (verify the cluster's topics against set). The
// flags override the spec files, as they do for run: --partitions sets every
// topic's partition count, --replication-factor every topic's replication
// factor (see topicspec.Set.WithReplicationFactor).
func topicsCommand(ctx context.Context, adm *kadm.Client, set topicspec.Set, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("topics: missing subcommand; " + topicsUsage)
	}
	sub, rest := args[0], args[1:]
	if sub != "apply" && sub != "check" {
		return fmt.Errorf("topics: unknown subcommand %q; %s", sub, topicsUsage)
	}
	fs := flag.NewFlagSet("topics "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	partitions := fs.Int("partitions", 0, "partition count of every topic (default: the spec files, 6)")
	rf := fs.Int("replication-factor", 0, "replication factor of every topic (default: the spec files, 1; production: 3)")
	if err := fs.Parse(rest); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stdout, topicsUsage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return nil
	} else if err != nil {
		return fmt.Errorf("topics %s: %w; %s", sub, err, topicsUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("topics %s: unexpected argument %q; %s", sub, fs.Arg(0), topicsUsage)
	}
	set, err := overrideTopics(set, *partitions, *rf)
	if err != nil {
		return fmt.Errorf("topics %s: %w", sub, err)
	}

	if sub == "apply" {
		created, err := set.Apply(ctx, adm)
		for _, name := range created {
			fmt.Fprintf(stdout, "created %s\n", name)
		}
		if err != nil {
			return fmt.Errorf("topics apply: %w", err)
		}
		if len(created) == 0 {
			fmt.Fprintf(stdout, "all %d topics exist\n", len(set.Names()))
		}
		return nil
	}
	problems, err := set.Check(ctx, adm)
	if err != nil {
		return fmt.Errorf("topics check: %w", err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("topics check: %w", &topicspec.CheckError{Problems: problems})
	}
	fmt.Fprintf(stdout, "ok: %d topics match topics/\n", len(set.Names()))
	return nil
}

// overrideTopics applies the --partitions and --replication-factor flags to
// set; zero leaves the spec's value. It is shared with run.
func overrideTopics(set topicspec.Set, partitions, replicationFactor int) (topicspec.Set, error) {
	if partitions < 0 || partitions > 1<<31-1 {
		return set, fmt.Errorf("--partitions must be between 1 and %d, got %d", 1<<31-1, partitions)
	}
	if replicationFactor < 0 || replicationFactor > 1<<15-1 {
		return set, fmt.Errorf("--replication-factor must be between 1 and %d, got %d", 1<<15-1, replicationFactor)
	}
	if partitions > 0 {
		set = set.WithPartitions(int32(partitions))
	}
	if replicationFactor > 0 {
		set = set.WithReplicationFactor(int16(replicationFactor))
	}
	return set, set.Validate()
}
