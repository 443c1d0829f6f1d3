package topicspec

import (
	"errors"
	"strings"
	"testing"
)

// observedFrom returns what a cluster that matches s exactly would report.
func observedFrom(s Set) map[string]observed {
	got := map[string]observed{}
	for _, sp := range s.specs {
		cfg := map[string]string{"segment.bytes": "104857600"} // a key the spec does not declare
		for k, v := range sp.Configs {
			cfg[k] = v
		}
		got[sp.Name] = observed{Partitions: sp.Partitions, ReplicationFactor: sp.ReplicationFactor, Configs: cfg}
	}
	return got
}

// Guards the comparison at the heart of `topics check`: each kind of
// contradiction is one Problem, configs outside the spec are ignored, and
// list values compare as sets.
func TestCompare(t *testing.T) {
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		change func(map[string]observed)
		want   []Problem
	}{
		{"match", func(map[string]observed) {}, nil},
		{"undeclared config differs", func(g map[string]observed) {
			g["ai.tasks.retry"].Configs["segment.bytes"] = "1"
		}, nil},
		{"missing topic", func(g map[string]observed) { delete(g, "ai.tasks.alerts") },
			[]Problem{{Topic: "ai.tasks.alerts", Field: FieldExists, Want: "exists", Got: "missing"}}},
		{"replication factor", func(g map[string]observed) {
			o := g["ai.tasks.audit"]
			o.ReplicationFactor = 3
			g["ai.tasks.audit"] = o
		}, []Problem{{Topic: "ai.tasks.audit", Field: FieldReplicationFactor, Want: "1", Got: "3"}}},
		{"contradicting cleanup.policy", func(g map[string]observed) {
			g["faultrouter.state"].Configs["cleanup.policy"] = "delete"
		}, []Problem{{Topic: "faultrouter.state", Field: "cleanup.policy", Want: "compact", Got: "delete"}}},
		{"config not reported", func(g map[string]observed) {
			delete(g["ai.tasks.audit"].Configs, "retention.ms")
		}, []Problem{{Topic: "ai.tasks.audit", Field: "retention.ms", Want: "7776000000", Got: ""}}},
		{"all co-partitioned topics differ from spec but agree", func(g map[string]observed) {
			for _, n := range []string{"ai.tasks.ingress", "ai.tasks.review.decisions", "faultrouter.state"} {
				o := g[n]
				o.Partitions = 12
				g[n] = o
			}
		}, []Problem{
			{Topic: "ai.tasks.ingress", Field: FieldPartitions, Want: "6", Got: "12"},
			{Topic: "ai.tasks.review.decisions", Field: FieldPartitions, Want: "6", Got: "12"},
			{Topic: "faultrouter.state", Field: FieldPartitions, Want: "6", Got: "12"},
		}},
		{"decisions not co-partitioned", func(g map[string]observed) {
			o := g["ai.tasks.review.decisions"]
			o.Partitions = 3
			g["ai.tasks.review.decisions"] = o
		}, []Problem{
			{Topic: "ai.tasks.review.decisions", Field: FieldPartitions, Want: "6", Got: "3"},
			{Topic: "ai.tasks.ingress, ai.tasks.review.decisions, faultrouter.state", Field: FieldCoPartitioning,
				Want: "equal partition counts", Got: "ai.tasks.ingress=6, ai.tasks.review.decisions=3, faultrouter.state=6"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := observedFrom(s)
			tt.change(g)
			got := compare(s, g)
			if len(got) != len(tt.want) {
				t.Fatalf("compare = %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("problem %d = %#v, want %#v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// Guards the message `run` and `topics check` print: one plain sentence per
// problem, and a CheckError that lists them all and wraps ErrMismatch.
func TestProblemSentences(t *testing.T) {
	tests := []struct {
		p    Problem
		want string
	}{
		{Problem{Topic: "ai.tasks.alerts", Field: FieldExists, Want: "exists", Got: "missing"},
			"topic ai.tasks.alerts does not exist"},
		{Problem{Topic: "ai.tasks.ingress", Field: FieldPartitions, Want: "6", Got: "3"},
			"topic ai.tasks.ingress has 3 partitions, the spec wants 6"},
		{Problem{Topic: "ai.tasks.audit", Field: FieldReplicationFactor, Want: "1", Got: "3"},
			"topic ai.tasks.audit has replication factor 3, the spec wants 1"},
		{Problem{Topic: "a, b, c", Field: FieldCoPartitioning, Want: "equal partition counts", Got: "a=6, b=3, c=6"},
			"topics a, b and c must have the same partition count (co-partitioned by task_id), they have a=6, b=3, c=6"},
		{Problem{Topic: "faultrouter.state", Field: "cleanup.policy", Want: "compact", Got: "delete"},
			"topic faultrouter.state has cleanup.policy=delete, the spec wants cleanup.policy=compact"},
		{Problem{Topic: "ai.tasks.audit", Field: "retention.ms", Want: "7776000000"},
			"topic ai.tasks.audit does not report retention.ms, the spec wants retention.ms=7776000000"},
	}
	var all []Problem
	for _, tt := range tests {
		if got := tt.p.Error(); got != tt.want {
			t.Errorf("Error() = %q\n want %q", got, tt.want)
		}
		if tt.p.String() != tt.p.Error() {
			t.Errorf("String() differs from Error()")
		}
		all = append(all, tt.p)
	}
	err := error(&CheckError{Problems: all})
	if !errors.Is(err, ErrMismatch) {
		t.Errorf("CheckError does not wrap ErrMismatch")
	}
	if n := strings.Count(err.Error(), "\n  - "); n != len(all) {
		t.Errorf("CheckError lists %d problems, want %d:\n%s", n, len(all), err)
	}
}

// Guards config comparison of list values: cleanup.policy "compact,delete"
// matches "delete, compact" but not "compact".
func TestSameConfigValue(t *testing.T) {
	tests := []struct {
		want, got string
		same      bool
	}{
		{"compact", "compact", true},
		{"compact,delete", "delete, compact", true},
		{"compact,delete", "compact", false},
		{"compact", "delete", false},
		{"604800000", "604800000", true},
		{"604800000", "86400000", false},
	}
	for _, tt := range tests {
		if got := sameConfigValue(tt.want, tt.got); got != tt.same {
			t.Errorf("sameConfigValue(%q, %q) = %v, want %v", tt.want, tt.got, got, tt.same)
		}
	}
}
