// Package integration holds faultrouter's end-to-end tests. They drive the
// real binary (built once per run) against a real Apache Kafka broker started
// by kafka.sh beside this file; `make test` starts and stops that broker and
// sets FAULTROUTER_TEST_BROKERS. Without it the tests skip, unless
// FAULTROUTER_REQUIRE_BROKER=1 (as in CI), where they fail instead.
//
// Every test uses its own topic prefix and consumer group, so tests share one
// broker without seeing each other's records.
package integration
