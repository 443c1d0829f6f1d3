package main

import (
	"context"
	"errors"
	"io"

	"github.com/twmb/franz-go/pkg/kadm"
)

// topicsVerb parses the global flags of `topics apply|check` and runs it.
func topicsVerb(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		io.WriteString(stdout, topicsUsage+"\n")
		if len(args) == 0 {
			return errors.New("topics: missing subcommand apply or check")
		}
		return nil
	}
	fs, g := newFlagSet("topics "+args[0], topicsUsage, stderr)
	partitions := fs.Int("partitions", 0, "partition count of every topic (default: topics/, 6)")
	rf := fs.Int("replication-factor", 0, "replication factor of every topic (default: topics/, 1; production: 3)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	set, err := g.topics()
	if err != nil {
		return err
	}
	cl, err := g.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	sub := append([]string{args[0]}, "--partitions", itoa(*partitions), "--replication-factor", itoa(*rf))
	sub = append(sub, fs.Args()...)
	return topicsCommand(ctx, kadm.NewClient(cl), set, sub, stdout)
}
