package topicspec

import (
	"fmt"
	"slices"
	"strings"
)

// Fields of a Problem that are not topic configs. Any other Field is the name
// of a topic config, such as cleanup.policy.
const (
	FieldExists            = "exists"
	FieldPartitions        = "partitions"
	FieldReplicationFactor = "replication.factor"
	FieldCoPartitioning    = "co-partitioning"
)

// Problem is one way the cluster contradicts the spec.
type Problem struct {
	// Topic is the Kafka topic name; for FieldCoPartitioning, the names of the
	// co-partitioned topics joined by ", ".
	Topic string
	// Field is FieldExists, FieldPartitions, FieldReplicationFactor,
	// FieldCoPartitioning or a topic config key.
	Field string
	// Want is what the spec declares.
	Want string
	// Got is what the cluster has; empty for a config the broker did not report.
	Got string
}

// Error returns the problem as one sentence.
func (p Problem) Error() string {
	switch p.Field {
	case FieldExists:
		return fmt.Sprintf("topic %s does not exist", p.Topic)
	case FieldPartitions:
		return fmt.Sprintf("topic %s has %s partitions, the spec wants %s", p.Topic, p.Got, p.Want)
	case FieldReplicationFactor:
		return fmt.Sprintf("topic %s has replication factor %s, the spec wants %s", p.Topic, p.Got, p.Want)
	case FieldCoPartitioning:
		names := strings.Split(p.Topic, ", ")
		return fmt.Sprintf("topics %s must have the same partition count (co-partitioned by task_id), they have %s",
			joinAnd(names), p.Got)
	}
	if p.Got == "" {
		return fmt.Sprintf("topic %s does not report %s, the spec wants %s=%s", p.Topic, p.Field, p.Field, p.Want)
	}
	return fmt.Sprintf("topic %s has %s=%s, the spec wants %s=%s", p.Topic, p.Field, p.Got, p.Field, p.Want)
}

// String returns the same sentence as Error.
func (p Problem) String() string { return p.Error() }

// CheckError is returned by Ensure when the cluster contradicts the spec. It
// wraps ErrMismatch.
type CheckError struct {
	Problems []Problem
}

// Error lists every problem, one a line.
func (e *CheckError) Error() string {
	var b strings.Builder
	n := len(e.Problems)
	fmt.Fprintf(&b, "topicspec: %d topic problem", n)
	if n != 1 {
		b.WriteString("s")
	}
	b.WriteString(" contradict the spec in topics/ (fix the topics, or override partitions or replication factor to match them):")
	for _, p := range e.Problems {
		b.WriteString("\n  - ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap returns ErrMismatch.
func (e *CheckError) Unwrap() error { return ErrMismatch }

// observed is what the cluster has for one topic.
type observed struct {
	Partitions        int32
	ReplicationFactor int16
	Configs           map[string]string
}

// compare lists every way the observed topics (by Kafka name; an absent name
// is a missing topic) contradict the set, in the order of the set's topics.
// It is pure: Check gathers observed from the cluster.
func compare(s Set, got map[string]observed) []Problem {
	var problems []Problem
	for _, sp := range s.specs {
		o, ok := got[sp.Name]
		if !ok {
			problems = append(problems, Problem{Topic: sp.Name, Field: FieldExists, Want: "exists", Got: "missing"})
			continue
		}
		if o.Partitions != sp.Partitions {
			problems = append(problems, Problem{Topic: sp.Name, Field: FieldPartitions,
				Want: fmt.Sprint(sp.Partitions), Got: fmt.Sprint(o.Partitions)})
		}
		if o.ReplicationFactor != sp.ReplicationFactor {
			problems = append(problems, Problem{Topic: sp.Name, Field: FieldReplicationFactor,
				Want: fmt.Sprint(sp.ReplicationFactor), Got: fmt.Sprint(o.ReplicationFactor)})
		}
		keys := make([]string, 0, len(sp.Configs))
		for k := range sp.Configs {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			want := sp.Configs[k]
			have, ok := o.Configs[k]
			if !ok || !sameConfigValue(want, have) {
				problems = append(problems, Problem{Topic: sp.Name, Field: k, Want: want, Got: have})
			}
		}
	}
	if p, ok := coPartitionProblem(s, got); ok {
		problems = append(problems, p)
	}
	return problems
}

// coPartitionProblem reports whether the existing co-partitioned topics have
// different partition counts. It is separate from a partition-count problem:
// ingress and decisions may agree with each other and both differ from the
// spec, which is adoptable with an override, or differ from each other, which
// no override fixes.
func coPartitionProblem(s Set, got map[string]observed) (Problem, bool) {
	var names, counts []string
	differ := false
	var first int32 = -1
	for _, short := range coPartitioned {
		name := s.mustSpec(short).Name
		o, ok := got[name]
		if !ok {
			continue
		}
		if first == -1 {
			first = o.Partitions
		} else if o.Partitions != first {
			differ = true
		}
		names = append(names, name)
		counts = append(counts, fmt.Sprintf("%s=%d", name, o.Partitions))
	}
	if !differ {
		return Problem{}, false
	}
	return Problem{
		Topic: strings.Join(names, ", "),
		Field: FieldCoPartitioning,
		Want:  "equal partition counts",
		Got:   strings.Join(counts, ", "),
	}, true
}

// sameConfigValue compares two config values, treating a list value such as
// cleanup.policy "compact,delete" as a set: order and spaces do not matter.
func sameConfigValue(want, got string) bool {
	if want == got {
		return true
	}
	norm := func(v string) []string {
		parts := strings.Split(v, ",")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		slices.Sort(parts)
		return parts
	}
	return slices.Equal(norm(want), norm(got))
}
