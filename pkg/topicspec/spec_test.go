package topicspec

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/faultrouter/faultrouter/topics"
)

// Guards the topics table of docs/design.md: the default names, the co-partitioned
// counts, a single-broker replication factor, a compacted state changelog and
// long audit retention.
func TestLoadDefaults(t *testing.T) {
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	want := map[Short]string{
		"ingress":    "ai.tasks.ingress",
		"decisions":  "ai.tasks.review.decisions",
		"retry":      "ai.tasks.retry",
		"review":     "ai.tasks.review",
		"audit":      "ai.tasks.audit",
		"deadletter": "ai.tasks.deadletter",
		"alerts":     "ai.tasks.alerts",
		"state":      "faultrouter.state",
		"breakers":   "faultrouter.breakers",
	}
	if got := len(s.Specs()); got != len(want) {
		t.Fatalf("Load returned %d topics, want %d", got, len(want))
	}
	for short, name := range want {
		got, err := s.Name(short)
		if err != nil || got != name {
			t.Errorf("Name(%q) = %q, %v; want %q", short, got, err, name)
		}
	}
	for _, short := range coPartitioned {
		if sp, _ := s.Spec(short); sp.Partitions != 6 {
			t.Errorf("%s has %d partitions, want 6", short, sp.Partitions)
		}
	}
	for _, sp := range s.Specs() {
		if sp.ReplicationFactor != 1 {
			t.Errorf("%s has replication factor %d, want 1", sp.Short, sp.ReplicationFactor)
		}
		if sp.Configs["min.insync.replicas"] != "1" {
			t.Errorf("%s has min.insync.replicas %q, want 1", sp.Short, sp.Configs["min.insync.replicas"])
		}
	}
	if st, _ := s.Spec("state"); st.Configs["cleanup.policy"] != "compact" {
		t.Errorf("state cleanup.policy = %q, want compact", st.Configs["cleanup.policy"])
	}
	if a, _ := s.Spec("audit"); a.Configs["retention.ms"] != "7776000000" {
		t.Errorf("audit retention.ms = %q, want 90 days (7776000000)", a.Configs["retention.ms"])
	}
}

// Guards --topic-prefix: the prefix is prepended to every name, and a prefix
// that makes an illegal Kafka name is refused with the reason.
func TestLoadPrefix(t *testing.T) {
	s, err := Load("staging.")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range s.Names() {
		if !strings.HasPrefix(name, "staging.") {
			t.Errorf("name %q lacks the prefix", name)
		}
	}
	if got, _ := s.Name("decisions"); got != "staging.ai.tasks.review.decisions" {
		t.Errorf("Name(decisions) = %q", got)
	}
	_, err = Load("bad prefix/")
	if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), `' '`) {
		t.Errorf("Load(bad prefix) = %v, want ErrInvalidSpec naming the bad character", err)
	}
}

// Guards the CLI's short names: an unknown one is an error that lists the
// allowed ones.
func TestNameUnknown(t *testing.T) {
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Name("ingres")
	if !errors.Is(err, ErrUnknownTopic) {
		t.Fatalf("Name(ingres) = %v, want ErrUnknownTopic", err)
	}
	for _, short := range Shorts() {
		if !strings.Contains(err.Error(), string(short)) {
			t.Errorf("error %q does not list %q", err, short)
		}
	}
}

// Guards strict spec files: a malformed spec is refused at load time with the
// file and the reason, never half-applied.
func TestLoadRejectsBadSpecs(t *testing.T) {
	good := func() fstest.MapFS {
		m := fstest.MapFS{}
		for _, short := range shorts {
			data, err := topics.FS.ReadFile(string(short) + ".yaml")
			if err != nil {
				t.Fatal(err)
			}
			m[string(short)+".yaml"] = &fstest.MapFile{Data: data}
		}
		return m
	}
	tests := []struct {
		name   string
		change func(fstest.MapFS)
		want   string
	}{
		{"unknown field", func(m fstest.MapFS) {
			m["retry.yaml"].Data = append(m["retry.yaml"].Data, []byte("retention: 1\n")...)
		}, "retry.yaml"},
		{"short differs from file", func(m fstest.MapFS) {
			m["alerts.yaml"].Data = []byte("short: alert\nname: x\npartitions: 1\nreplication_factor: 1\n")
		}, `short is "alert", want "alerts"`},
		{"missing file", func(m fstest.MapFS) { delete(m, "audit.yaml") }, "audit.yaml"},
		{"extra file", func(m fstest.MapFS) { m["extra.yaml"] = &fstest.MapFile{Data: []byte("short: extra\n")} }, "extra.yaml is not a faultrouter topic"},
		{"zero partitions", func(m fstest.MapFS) {
			m["retry.yaml"].Data = []byte("short: retry\nname: r\npartitions: 0\nreplication_factor: 1\n")
		}, "retry: partitions must be at least 1"},
		{"not co-partitioned", func(m fstest.MapFS) {
			m["state.yaml"].Data = []byte("short: state\nname: s\npartitions: 3\nreplication_factor: 1\n")
		}, "ingress, decisions and state must have the same count"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := good()
			if _, err := load(m, ""); err != nil {
				t.Fatalf("unchanged specs: %v", err)
			}
			tt.change(m)
			_, err := load(m, "")
			if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("load = %v, want ErrInvalidSpec containing %q", err, tt.want)
			}
		})
	}
}

// Guards the overrides `run` uses: partitions apply to every topic (keeping
// co-partitioning), a replication factor of 3 raises min.insync.replicas to 2,
// the original set is not changed, and nonsense values fail Validate.
func TestOverrides(t *testing.T) {
	s, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	o := s.WithPartitions(12).WithReplicationFactor(3)
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, sp := range o.Specs() {
		if sp.Partitions != 12 || sp.ReplicationFactor != 3 || sp.Configs["min.insync.replicas"] != "2" {
			t.Errorf("%s: partitions %d, rf %d, min.insync.replicas %s; want 12, 3, 2",
				sp.Short, sp.Partitions, sp.ReplicationFactor, sp.Configs["min.insync.replicas"])
		}
	}
	if sp, _ := s.Spec("ingress"); sp.Partitions != 6 || sp.ReplicationFactor != 1 || sp.Configs["min.insync.replicas"] != "1" {
		t.Errorf("overrides changed the original set: %+v", sp)
	}
	if err := s.WithPartitions(0).Validate(); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("WithPartitions(0).Validate() = %v, want ErrInvalidSpec", err)
	}
	if err := s.WithReplicationFactor(0).Validate(); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("WithReplicationFactor(0).Validate() = %v, want ErrInvalidSpec", err)
	}
	if err := (Set{}).Validate(); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("zero Set Validate() = %v, want ErrInvalidSpec", err)
	}
}
