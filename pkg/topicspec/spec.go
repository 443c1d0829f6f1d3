// Package topicspec loads faultrouter's topic specifications (the YAML files
// embedded by package topics), creates the topics a cluster lacks, and checks
// that the cluster's topics agree with the spec: that they exist, have the
// declared partition counts and replication factors, carry no config that
// contradicts the spec, and that ingress, decisions and state are
// co-partitioned.
package topicspec

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/faultrouter/faultrouter/topics"
)

// Short is a topic's short name: the name the command line, the spec files
// and every tool's reports use (the Kafka name is the set's prefix and the
// spec's name). The topics are declared here once; Topics, the router's,
// the console's, the control verbs' and the what-if's topic sets, derive
// from them.
type Short string

// The topics, in the order of docs/design.md's topics table. Each has a
// file <short>.yaml in package topics.
const (
	Ingress    Short = "ingress"
	Decisions  Short = "decisions"
	Retry      Short = "retry"
	Review     Short = "review"
	Audit      Short = "audit"
	DeadLetter Short = "deadletter"
	Alerts     Short = "alerts"
	State      Short = "state"
	Breakers   Short = "breakers"
)

var shorts = []Short{Ingress, Decisions, Retry, Review, Audit, DeadLetter, Alerts, State, Breakers}

// coPartitioned are the topics that must have the same partition count: the
// router reads ingress and decisions partition p together and restores the
// state of those tasks from state partition p.
var coPartitioned = []Short{Ingress, Decisions, State}

// maxNameLen is Kafka's limit on a topic name's length.
const maxNameLen = 249

// Spec is the declared shape of one topic.
type Spec struct {
	// Short is the name used on the command line, e.g. "ingress".
	Short Short `yaml:"short"`
	// Name is the Kafka topic name; once loaded, it includes the prefix.
	Name string `yaml:"name"`
	// Partitions is the partition count, at least 1.
	Partitions int32 `yaml:"partitions"`
	// ReplicationFactor is the number of replicas of each partition, at least 1.
	ReplicationFactor int16 `yaml:"replication_factor"`
	// Configs are topic configs (retention.ms, cleanup.policy, ...). Check
	// compares only these keys; every other config is the broker's business.
	Configs map[string]string `yaml:"configs"`
}

// Set is every faultrouter topic, addressed by short name. The zero Set holds
// no topics; build one with Load.
type Set struct {
	specs  []Spec // in the order of shorts
	prefix string // Load's prefix
}

// Shorts returns the short names of all topics, in the order of docs/design.md.
func Shorts() []Short { return slices.Clone(shorts) }

// Load returns the embedded topic specs with prefix prepended to every topic
// name (prefix may be empty). It returns an error wrapping ErrInvalidSpec when
// a spec is malformed or the prefixed names are not valid Kafka topic names.
func Load(prefix string) (Set, error) {
	return load(topics.FS, prefix)
}

// load reads one <short>.yaml per topic from fsys.
func load(fsys fs.FS, prefix string) (Set, error) {
	files, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return Set{}, fmt.Errorf("%w: %v", ErrInvalidSpec, err)
	}
	for _, f := range files {
		if !slices.Contains(shorts, Short(strings.TrimSuffix(f, ".yaml"))) {
			return Set{}, fmt.Errorf("%w: %s is not a faultrouter topic; the files are %s",
				ErrInvalidSpec, f, strings.Join(fileNames(), ", "))
		}
	}
	s := Set{prefix: prefix}
	for _, short := range shorts {
		file := string(short) + ".yaml"
		data, err := fs.ReadFile(fsys, file)
		if err != nil {
			return Set{}, fmt.Errorf("%w: %s: %v", ErrInvalidSpec, file, err)
		}
		sp, err := parse(file, data)
		if err != nil {
			return Set{}, err
		}
		sp.Name = prefix + sp.Name
		s.specs = append(s.specs, sp)
	}
	if err := s.Validate(); err != nil {
		return Set{}, err
	}
	return s, nil
}

// parse decodes one spec file strictly: an unknown field is an error, and the
// short name must match the file name.
func parse(file string, data []byte) (Spec, error) {
	var sp Spec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&sp); err != nil {
		return Spec{}, fmt.Errorf("%w: %s: %v", ErrInvalidSpec, file, err)
	}
	if want := Short(strings.TrimSuffix(path.Base(file), ".yaml")); sp.Short != want {
		return Spec{}, fmt.Errorf("%w: %s: short is %q, want %q (the file name)", ErrInvalidSpec, file, sp.Short, want)
	}
	if sp.Configs == nil {
		sp.Configs = map[string]string{}
	}
	return sp, nil
}

// Validate reports the first reason the set cannot be applied: a missing
// topic, an invalid name, a partition count or replication factor below 1,
// or co-partitioned topics with different partition counts. Apply, Check and
// Ensure call it first.
func (s Set) Validate() error {
	if len(s.specs) != len(shorts) {
		return fmt.Errorf("%w: the set holds %d topics, want %d (build it with Load)", ErrInvalidSpec, len(s.specs), len(shorts))
	}
	for i, sp := range s.specs {
		if sp.Short != shorts[i] {
			return fmt.Errorf("%w: topic %d is %q, want %q (build the set with Load)", ErrInvalidSpec, i, sp.Short, shorts[i])
		}
		if err := validName(sp.Name); err != nil {
			return fmt.Errorf("%w: %s: name: %v", ErrInvalidSpec, sp.Short, err)
		}
		if sp.Partitions < 1 {
			return fmt.Errorf("%w: %s: partitions must be at least 1, got %d", ErrInvalidSpec, sp.Short, sp.Partitions)
		}
		if sp.ReplicationFactor < 1 {
			return fmt.Errorf("%w: %s: replication_factor must be at least 1, got %d", ErrInvalidSpec, sp.Short, sp.ReplicationFactor)
		}
		for k, v := range sp.Configs {
			if k == "" || v == "" {
				return fmt.Errorf("%w: %s: configs: empty key or value (%q: %q)", ErrInvalidSpec, sp.Short, k, v)
			}
		}
	}
	first := s.mustSpec(coPartitioned[0])
	for _, short := range coPartitioned[1:] {
		if sp := s.mustSpec(short); sp.Partitions != first.Partitions {
			return fmt.Errorf("%w: %s has %d partitions and %s has %d; %s must have the same count (co-partitioned by task_id)",
				ErrInvalidSpec, first.Short, first.Partitions, sp.Short, sp.Partitions, joinAnd(coPartitioned))
		}
	}
	return nil
}

// validName reports whether name is a legal Kafka topic name.
func validName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty")
	case name == "." || name == "..":
		return fmt.Errorf("%q is not allowed", name)
	case len(name) > maxNameLen:
		return fmt.Errorf("%q is %d characters, Kafka allows %d", name, len(name), maxNameLen)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q contains %q; Kafka allows letters, digits, '.', '_' and '-'", name, r)
		}
	}
	return nil
}

// Specs returns a copy of every topic's spec, in the order of docs/design.md.
func (s Set) Specs() []Spec {
	out := make([]Spec, len(s.specs))
	for i, sp := range s.specs {
		out[i] = sp.clone()
	}
	return out
}

// Spec returns the spec of the topic with the given short name, or an error
// wrapping ErrUnknownTopic that lists the allowed short names.
func (s Set) Spec(short Short) (Spec, error) {
	for _, sp := range s.specs {
		if sp.Short == short {
			return sp.clone(), nil
		}
	}
	return Spec{}, fmt.Errorf("%w %q: use one of %s", ErrUnknownTopic, short, strings.Join(s.shorts(), ", "))
}

// Name returns the Kafka topic name (prefix included) of the topic with the
// given short name: "ingress" -> "<prefix>ai.tasks.ingress". An unknown short
// name is an error wrapping ErrUnknownTopic that lists the allowed ones.
func (s Set) Name(short Short) (string, error) {
	sp, err := s.Spec(short)
	if err != nil {
		return "", err
	}
	return sp.Name, nil
}

// Topics are the full names of the topics, one field per short name: the
// one declaration the router's, the console's, the control verbs' and the
// what-if's topic sets are (each reads the fields it needs).
type Topics struct {
	Ingress, Decisions, Retry, Review, Audit, DeadLetter, Alerts, State string
	// Breakers is the compacted topic the router instances share their
	// breakers and latches through. Optional for a router: without it each
	// instance's breakers are its own and live in its memory only.
	Breakers string
}

// Topics returns the full names of the set's topics.
func (s Set) Topics() Topics {
	n := func(short Short) string {
		name, err := s.Name(short)
		if err != nil {
			panic(err) // every Set holds every short name (load, Validate)
		}
		return name
	}
	return Topics{Ingress: n(Ingress), Decisions: n(Decisions), Retry: n(Retry), Review: n(Review), Audit: n(Audit),
		DeadLetter: n(DeadLetter), Alerts: n(Alerts), State: n(State), Breakers: n(Breakers)}
}

// Prefix is the prefix Load put before every topic name: a tool's own
// topic beside the router's (the console's) takes it too.
func (s Set) Prefix() string { return s.prefix }

// Names returns every topic's Kafka name, in the order of docs/design.md.
func (s Set) Names() []string {
	out := make([]string, len(s.specs))
	for i, sp := range s.specs {
		out[i] = sp.Name
	}
	return out
}

// WithPartitions returns a copy of s in which every topic has n partitions
// (so ingress, decisions and state stay co-partitioned). The default is the
// count in each spec file (6). Validate rejects n < 1.
func (s Set) WithPartitions(n int32) Set {
	out := Set{specs: s.Specs(), prefix: s.prefix}
	for i := range out.specs {
		out.specs[i].Partitions = n
	}
	return out
}

// WithReplicationFactor returns a copy of s in which every topic has rf
// replicas, and every topic whose spec sets min.insync.replicas has it set to
// Kafka's usual pairing for rf: 1 for rf <= 2, 2 for rf >= 3 (so that one
// broker can be lost without losing an acknowledged write, and writes go on).
// The default is the factor in each spec file (1, for a single broker);
// production clusters should use 3. Validate rejects rf < 1.
func (s Set) WithReplicationFactor(rf int16) Set {
	out := Set{specs: s.Specs(), prefix: s.prefix}
	minISR := "1"
	if rf >= 3 {
		minISR = "2"
	}
	for i := range out.specs {
		out.specs[i].ReplicationFactor = rf
		if _, ok := out.specs[i].Configs["min.insync.replicas"]; ok {
			out.specs[i].Configs["min.insync.replicas"] = minISR
		}
	}
	return out
}

// mustSpec returns the spec of a short name known to be in the set.
func (s Set) mustSpec(short Short) Spec {
	for _, sp := range s.specs {
		if sp.Short == short {
			return sp
		}
	}
	panic("topicspec: missing topic " + string(short))
}

func (s Set) shorts() []string {
	out := make([]string, 0, len(shorts))
	if len(s.specs) == 0 {
		for _, sh := range shorts {
			out = append(out, string(sh))
		}
		return out
	}
	for _, sp := range s.specs {
		out = append(out, string(sp.Short))
	}
	return out
}

func (sp Spec) clone() Spec {
	sp.Configs = maps.Clone(sp.Configs)
	return sp
}

func fileNames() []string {
	out := make([]string, len(shorts))
	for i, s := range shorts {
		out[i] = string(s) + ".yaml"
	}
	return out
}

// joinAnd joins words as "a, b and c".
func joinAnd[S ~string](ws []S) string {
	words := make([]string, len(ws))
	for i, w := range ws {
		words[i] = string(w)
	}
	if len(words) <= 1 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}
