#!/usr/bin/env bash
# The project's test command (`make test`): formatting and vet, the unit tests
# (the router's and the console's again under the race detector),
# short fuzz runs of the decoders on top of their corpus, then the integration
# tests against a real Apache Kafka broker that this script starts and stops,
# among them the wire format as Java Avro and a Python worker (confluent-kafka,
# fastavro) see it (integration/interop.sh prepares both), and the Confluent
# wire format through a real schema registry (integration/registry.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# An execution count, not a duration: a duration-bounded -fuzztime can end in a
# spurious "context deadline exceeded" on Go 1.26 (go.dev/issue/75804).
fuzzexecs=${FUZZEXECS:-150000}

echo "== gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n $unformatted ]]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi
go vet ./...

echo "== docs: every relative link resolves, every faultrouter command shown is in its verb's --help"
go test -count=1 -run '^TestDocs' ./internal/docscheck ./cmd/faultrouter

echo "== unit tests"
go test -count=1 $(go list ./... | grep -v /integration)

# the router's (its parts' packages too) and the console's concurrency under the race detector: about 4
# minutes on 2 cores (-short trims the router's 200-seed restore property test,
# run whole above, to 40 seeds, and skips the console's 100,000-record page
# work tests, run above; the rest runs whole)
echo "== the router's and the console's unit tests under -race"
go test -count=1 -race -short -skip '^TestSilentRevokeLetsThePartitionsGo$' ./internal/router/... ./internal/console/

echo "== fuzz the decoder for $fuzzexecs executions"
go test -run='^$' -fuzz=FuzzDecode -fuzztime="${fuzzexecs}x" ./pkg/codec
echo "== fuzz the restore's task state reader against the full decode for $fuzzexecs executions"
go test -run='^$' -fuzz=FuzzStateIndex -fuzztime="${fuzzexecs}x" ./pkg/codec
echo "== fuzz the reading of schema registry schemas and bodies for $fuzzexecs executions"
go test -run='^$' -fuzz=FuzzForeign -fuzztime="${fuzzexecs}x" -fuzzminimizetime=100x ./pkg/codec

echo "== helm chart"
helm/check.sh

echo "== Java Avro and the Python worker's packages, for the wire-format tests (cached)"
FAULTROUTER_JAVA_CP=$(integration/interop.sh java)
FAULTROUTER_PYTHON=$(integration/interop.sh python)
export FAULTROUTER_JAVA_CP FAULTROUTER_PYTHON

echo "== Chromium for the console's browser test"
if [[ ! -x /usr/bin/chromium ]]; then
	# Debian's package; the test drives it headless with chromedp
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi

echo "== integration tests on a real Apache Kafka broker"
source integration/broker.sh
# the broker's SASL_SSL listener (kafka.sh; FAULTROUTER_KAFKA_SASL_SSL=0 turns it off) is tested too
if [[ ${FAULTROUTER_KAFKA_SASL_SSL:-1} == 1 ]]; then
	export FAULTROUTER_REQUIRE_SASL=1
fi

echo "== Apicurio Registry for the Confluent wire format tests (integration/registry.sh; cached)"
if integration/registry.sh java >/dev/null 2>&1; then
	# its schemas in a journal topic on the test broker, as registries are run
	export FAULTROUTER_REGISTRY_KAFKA=$FAULTROUTER_TEST_BROKERS
	FAULTROUTER_TEST_REGISTRY=$(integration/registry.sh start)
	export FAULTROUTER_TEST_REGISTRY FAULTROUTER_REQUIRE_REGISTRY=1
	stop_broker=$(trap -p EXIT | sed "s/^trap -- '\(.*\)' EXIT\$/\1/")
	trap "integration/registry.sh stop || true; $stop_broker" EXIT
else
	echo "no JDK 21 or newer found: the Schema Registry tests are SKIPPED (Apicurio Registry needs one)"
fi
go test -count=1 -v -timeout 30m ./integration/
if [[ -n ${FAULTROUTER_TEST_REGISTRY:-} ]]; then
	integration/registry.sh stop # its JVM has no part in the bench
fi

# make bench on a small backlog, only to prove that it works: its figures on a
# shared CI machine mean nothing, and nothing is asserted on them. It builds and
# runs the Kafka Streams peer too (bench/streams-peer; Kafka Streams and RocksDB,
# about 100 MB, are resolved into ~/.m2 on the first run: under a minute)
echo "== bench (small backlog)"
go run ./bench --brokers "$FAULTROUTER_TEST_BROKERS" --tasks 1000 --latency 2s --low-rate 200 --join 3s \
	--rss-tasks 2000 --fleet 3s --fleet-rate 100 --session-timeout 6s --json "$FAULTROUTER_KAFKA_DIR/bench-result.json"

# The router on three brokers, as production runs it: kafka.sh's cluster mode
# (three KRaft nodes on 127.0.0.1:19192-19194, FAULTROUTER_KAFKA_CLUSTER_PORT
# moves them; replication 3, min.insync.replicas 2) and TestClusterChaos
# against it alone, which SIGKILLs one node at a time. The single broker is
# done with and stopped first: the machine's cores go to the three nodes.
echo "== the three-broker chaos test on a three-node KRaft cluster"
integration/kafka.sh stop
stop_rest=$(trap -p EXIT | sed "s/^trap -- '\(.*\)' EXIT\$/\1/")
trap "integration/kafka.sh cluster stop || true; $stop_rest" EXIT
FAULTROUTER_TEST_CLUSTER=$(integration/kafka.sh cluster start)
FAULTROUTER_TEST_BROKERS=$FAULTROUTER_TEST_CLUSTER FAULTROUTER_TEST_CLUSTER=$FAULTROUTER_TEST_CLUSTER \
	go test -count=1 -v -timeout 10m -run '^TestClusterChaos$' ./integration/
integration/kafka.sh cluster stop
