// Package topics holds faultrouter's topic specifications: one YAML file per
// topic, embedded into the binary so that `faultrouter run` and
// `faultrouter topics apply|check` need no file on disk.
//
// Each file declares one topic:
//
//	short: ingress               # the name used on the command line; equals the file name
//	name: ai.tasks.ingress       # the Kafka topic name; --topic-prefix is prepended
//	partitions: 6                # ingress, decisions and state must be equal (co-partitioned by task_id)
//	replication_factor: 1        # 1 suits one broker; production uses 3
//	configs:                     # topic configs, verified by `topics check` key by key
//	  retention.ms: "604800000"
//
// Replication factor: the files say 1 so that the quick start, the demo and the
// tests work on a single broker. A production cluster should use 3 replicas with
// min.insync.replicas 2; pass --replication-factor 3 to `run` or `topics apply`
// (which also raises min.insync.replicas to 2), or edit the files and rebuild.
// Partition counts are overridden the same way with --partitions.
//
// Package github.com/faultrouter/faultrouter/pkg/topicspec loads, applies and
// checks these specs.
package topics

import "embed"

// FS holds the topic specifications, one <short>.yaml file per topic.
//
//go:embed *.yaml
var FS embed.FS
