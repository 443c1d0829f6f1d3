#!/usr/bin/env bash
# `make soak`: the reference-model checker (TestCheckerSoak) for as long as
# asked. Each round produces a seeded workload (seed SEED, SEED+1, ...) while
# router instances are killed, paused, scaled and the broker restarts, then
# recomputes every output from the input log and compares; the table at the
# end has one row per round.
#
#   make soak DURATION=30m            # rounds until 30 minutes have passed
#   make soak SEED=123456 DURATION=1s # replay one round of a printed seed
#   make soak-memory DURATION=1h      # two routers under a steady stream and
#                                     # names that come and go, on a
#                                     # time-compressed policy: memory,
#                                     # breakers and the breakers topic's live
#                                     # keys sampled 40 times; they must stay
#                                     # flat
#
#   make soak-cluster                 # one longer round on a three-node
#                                     # cluster (kafka.sh cluster, replication
#                                     # 3) with three broker SIGKILLs among
#                                     # the faults; SEED=n replays it
#
# JSON reports go to $FAULTROUTER_CHECKER_REPORTS (default: the temp dir).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

duration=${DURATION:-10m}
if [[ ${1:-} == cluster ]]; then
	# no single broker: the cluster's three nodes, in FAULTROUTER_KAFKA_DIR
	# (if unset, a fresh temp dir, removed at exit)
	if [[ -z ${FAULTROUTER_KAFKA_DIR:-} ]]; then
		FAULTROUTER_KAFKA_DIR=$(mktemp -d /tmp/faultrouter-kafka-XXXXXX)
		trap 'integration/kafka.sh cluster stop || true; rm -rf "$FAULTROUTER_KAFKA_DIR"' EXIT
	else
		trap 'integration/kafka.sh cluster stop || true' EXIT
	fi
	export FAULTROUTER_KAFKA_DIR
	FAULTROUTER_TEST_CLUSTER=$(integration/kafka.sh cluster start)
	export FAULTROUTER_TEST_CLUSTER FAULTROUTER_TEST_BROKERS=$FAULTROUTER_TEST_CLUSTER FAULTROUTER_REQUIRE_BROKER=1
	if [[ -n ${SEED:-} ]]; then
		export FAULTROUTER_SEED=$SEED
	fi
	go test -count=1 -v -timeout 30m -run '^TestCheckerCluster$' ./integration/
	exit
fi
source integration/broker.sh
if [[ ${1:-} == memory ]]; then
	export FAULTROUTER_MEMORY_SOAK_DURATION=$duration
	go test -count=1 -v -timeout 0 -run '^TestMemorySoak$' ./integration/
	exit
fi
export FAULTROUTER_SOAK_DURATION=$duration
if [[ -n ${SEED:-} ]]; then
	export FAULTROUTER_SEED=$SEED
fi
# no test timeout: the soak bounds itself (rounds start until DURATION has
# passed; a round bounds its own waits)
go test -count=1 -v -timeout 0 -run '^TestCheckerSoak$' ./integration/
