package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// errMissingTopics is the one answer of every verb to topics that do not
// exist: it names them and, for the router's own topics, the command that
// creates them.
type errMissingTopics struct {
	verb   string
	topics []string
	ours   bool   // every missing topic is one of topics/ under the prefix
	prefix string // the --topic-prefix in use
}

func (e errMissingTopics) Error() string {
	what := "topic " + e.topics[0] + " does not exist"
	if len(e.topics) > 1 {
		what = "topics " + strings.Join(e.topics, ", ") + " do not exist"
	}
	if !e.ours {
		return fmt.Sprintf("%s: %s", e.verb, what)
	}
	create := "faultrouter topics apply"
	if e.prefix != "" {
		create += " --topic-prefix " + e.prefix
	}
	them := "it"
	if len(e.topics) > 1 {
		them = "them"
	}
	return fmt.Sprintf("%s: %s; `%s` creates %s (and `faultrouter run` creates what is missing when it starts)", e.verb, what, create, them)
}

// requireTopics asks the cluster for names and returns errMissingTopics
// naming those it does not have, before a verb reads or writes them.
func (g *globals) requireTopics(ctx context.Context, verb string, opts []kgo.Opt, names ...string) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, names...)
	if err != nil {
		return fmt.Errorf("%s: listing topics: %w", verb, err)
	}
	var missing []string
	for _, n := range names {
		d, ok := details[n]
		if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			missing = append(missing, n)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	sort.Strings(missing)
	ours := true
	set, err := g.topics()
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, n := range set.Names() {
		known[n] = true
	}
	for _, n := range missing {
		ours = ours && known[n]
	}
	return errMissingTopics{verb: verb, topics: missing, ours: ours, prefix: g.prefix}
}
