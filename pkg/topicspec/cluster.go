package topicspec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Apply creates every topic of the set that the cluster lacks, with the
// spec's partitions, replication factor and configs, and returns the names of
// the topics it created. Existing topics are left as they are (Check reports
// how they differ). A topic created concurrently by another instance is not
// an error and is not in the returned list.
func (s Set) Apply(ctx context.Context, adm *kadm.Client) ([]string, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	existing, err := s.existing(ctx, adm)
	if err != nil {
		return nil, err
	}
	var created []string
	for _, sp := range s.specs {
		if _, ok := existing[sp.Name]; ok {
			continue
		}
		configs := make(map[string]*string, len(sp.Configs))
		for k, v := range sp.Configs {
			configs[k] = kadm.StringPtr(v)
		}
		resp, err := adm.CreateTopic(ctx, sp.Partitions, sp.ReplicationFactor, configs, sp.Name)
		switch {
		case errors.Is(err, kerr.TopicAlreadyExists):
			continue
		case err != nil:
			msg := ""
			if resp.ErrMessage != "" {
				msg = " (" + resp.ErrMessage + ")"
			}
			return created, fmt.Errorf("topicspec: creating topic %s (%s): %w%s", sp.Name, sp.Short, err, msg)
		}
		created = append(created, sp.Name)
	}
	return created, nil
}

// Check compares the cluster's topics with the set and returns every
// problem: a missing topic, a partition count or replication factor that
// differs, a config (only the keys the spec declares) whose value contradicts
// the spec, and co-partitioned topics (ingress, decisions, state) whose
// partition counts differ. No problems means the cluster matches. The error
// is for a request that failed, not for a mismatch.
func (s Set) Check(ctx context.Context, adm *kadm.Client) ([]Problem, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	got, err := s.existing(ctx, adm)
	if err != nil {
		return nil, err
	}
	if len(got) > 0 {
		names := make([]string, 0, len(got))
		for name := range got {
			names = append(names, name)
		}
		rcs, err := adm.DescribeTopicConfigs(ctx, names...)
		if err != nil {
			return nil, fmt.Errorf("topicspec: describing topic configs: %w", err)
		}
		for _, rc := range rcs {
			if errors.Is(rc.Err, kerr.UnknownTopicOrPartition) {
				// The broker that answered the metadata knows the topic,
				// the one that answered DescribeConfigs does not yet (its
				// metadata lags the topic's creation): the topic is
				// reported missing, which Ensure waits out.
				delete(got, rc.Name)
				continue
			}
			if rc.Err != nil {
				return nil, fmt.Errorf("topicspec: describing configs of topic %s: %w", rc.Name, rc.Err)
			}
			o, ok := got[rc.Name]
			if !ok {
				continue
			}
			for _, c := range rc.Configs {
				if c.Value != nil {
					o.Configs[c.Key] = *c.Value
				}
			}
		}
	}
	return compare(s, got), nil
}

// Ensure applies the set and then checks it: the start-up step of `run`. It
// returns a *CheckError (wrapping ErrMismatch) that lists every problem when
// the cluster contradicts the spec, so that the router refuses to start with
// one clear message.
//
// Once Apply succeeded every topic of the set exists: Apply created it, it
// existed, or CreateTopics answered that it exists. A topic the following
// Check still reports missing is one the broker answering the metadata
// request does not know yet (`run` started right after `topics apply`, or
// after another instance created the topics), so Ensure waits for it, up to
// propagationTimeout, logging once which topics it waits for (log may be nil).
//
// The partition count of a spec is what a topic is created with: an
// existing topic keeps its own, as a Kafka Streams application keeps its
// source topics' (partitions added to ingress, decisions and state, then
// every instance restarted with its usual flags). Ensure logs such a
// difference and refuses only what the router cannot route with: ingress,
// decisions and state with different counts, replication factors and
// configs that contradict the spec, missing topics.
func (s Set) Ensure(ctx context.Context, adm *kadm.Client, log *slog.Logger) error {
	if _, err := s.Apply(ctx, adm); err != nil {
		return err
	}
	problems, err := s.checkPropagated(ctx, adm, log)
	if err != nil {
		return err
	}
	problems = slices.DeleteFunc(problems, func(p Problem) bool {
		if p.Field != FieldPartitions {
			return false
		}
		if log != nil {
			log.Info("topic keeps its partition count", "topic", p.Topic, "partitions", p.Got, "spec", p.Want)
		}
		return true
	})
	if len(problems) > 0 {
		return &CheckError{Problems: problems}
	}
	return nil
}

// existing returns, for each of the set's topics that exists, its partition
// count and replication factor (the smallest over its partitions), with an
// empty config map.
func (s Set) existing(ctx context.Context, adm *kadm.Client) (map[string]observed, error) {
	// kadm answers ListTopics from the client's metadata cache (up to
	// MetadataMinAge old, 5s by default), which would still miss topics that
	// Apply just created. A request for authorized operations bypasses that
	// cache (kadm metadata.go), so every Check sees the cluster as it is now.
	details, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), s.Names()...)
	if err != nil {
		return nil, fmt.Errorf("topicspec: listing topics: %w", err)
	}
	got := make(map[string]observed, len(details))
	for _, sp := range s.specs {
		d, ok := details[sp.Name]
		if !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			continue
		}
		if d.Err != nil {
			return nil, fmt.Errorf("topicspec: listing topic %s: %w", sp.Name, d.Err)
		}
		rf := -1
		for _, p := range d.Partitions {
			if rf == -1 || len(p.Replicas) < rf {
				rf = len(p.Replicas)
			}
		}
		got[sp.Name] = observed{
			Partitions:        int32(len(d.Partitions)),
			ReplicationFactor: int16(max(rf, 0)),
			Configs:           map[string]string{},
		}
	}
	return got, nil
}

// Topic creation reaches every broker's metadata shortly after CreateTopics
// returns; checkPropagated gives topics that exist but are not in the
// metadata yet this long to appear.
const (
	propagationTimeout = 30 * time.Second
	propagationPoll    = 200 * time.Millisecond
)

// checkPropagated runs Check, repeating it while a topic is still reported
// missing (metadata propagation), for up to propagationTimeout.
func (s Set) checkPropagated(ctx context.Context, adm *kadm.Client, log *slog.Logger) ([]Problem, error) {
	deadline := time.Now().Add(propagationTimeout)
	var waitedFor []string
	for {
		problems, err := s.Check(ctx, adm)
		if err != nil {
			return nil, err
		}
		var missing []string
		for _, p := range problems {
			if p.Field == FieldExists {
				missing = append(missing, p.Topic)
			}
		}
		if len(missing) == 0 && waitedFor != nil && log != nil {
			log.Info("topics appeared in the cluster metadata", "topics", waitedFor)
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			return problems, nil
		}
		if waitedFor == nil && log != nil {
			log.Info("waiting for topics to appear in the cluster metadata (they exist, the metadata lags their creation)",
				"topics", missing, "timeout", propagationTimeout)
		}
		waitedFor = missing
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(propagationPoll):
		}
	}
}
