# broker.sh, sourced (from the repository root) by test.sh and soak.sh:
# starts the run's Apache Kafka broker with kafka.sh and stops it at exit.
# The broker lives in FAULTROUTER_KAFKA_DIR (if unset, a fresh temp dir,
# removed at exit) on FAULTROUTER_KAFKA_PORT (default 19092); chaos_test.go
# restarts this very broker with `kafka.sh restart` and finds it by these two.
# Exports FAULTROUTER_TEST_BROKERS and FAULTROUTER_REQUIRE_BROKER=1.
if [[ -z ${FAULTROUTER_KAFKA_DIR:-} ]]; then
	FAULTROUTER_KAFKA_DIR=$(mktemp -d /tmp/faultrouter-kafka-XXXXXX)
	trap 'integration/kafka.sh stop || true; rm -rf "$FAULTROUTER_KAFKA_DIR"' EXIT
else
	trap 'integration/kafka.sh stop || true' EXIT
fi
export FAULTROUTER_KAFKA_DIR
export FAULTROUTER_KAFKA_PORT=${FAULTROUTER_KAFKA_PORT:-19092}
FAULTROUTER_TEST_BROKERS=$(integration/kafka.sh start)
export FAULTROUTER_TEST_BROKERS FAULTROUTER_REQUIRE_BROKER=1
