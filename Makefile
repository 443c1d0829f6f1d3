# faultrouter: the README's commands.
GO ?= go

.PHONY: build demo test unit fuzz soak soak-memory soak-cluster broker-start broker-stop lint bench

build: ## build bin/faultrouter
	$(GO) build -trimpath -o bin/faultrouter ./cmd/faultrouter

demo: ## the self-contained demo (embedded broker)
	$(GO) run ./cmd/faultrouter demo

test: ## everything: gofmt, vet, unit tests, fuzz, integration tests on a real Kafka broker
	integration/test.sh

soak: ## the reference-model checker under faults for DURATION (default 10m); SEED=n replays a seed
	DURATION=$(DURATION) SEED=$(SEED) integration/soak.sh

soak-memory: ## two routers for DURATION (default 10m) on a time-compressed policy, with names that come and go; their memory, breakers and the breakers topic's live keys must stay flat
	DURATION=$(DURATION) integration/soak.sh memory

soak-cluster: ## the checker on a three-node KRaft cluster (replication 3), three broker SIGKILLs among its faults (several minutes); SEED=n replays a seed
	SEED=$(SEED) integration/soak.sh cluster

unit: ## unit tests only (no broker)
	$(GO) test ./...

fuzz: ## fuzz the decoder for a million executions (a count, not a duration: go.dev/issue/75804)
	$(GO) test -run='^$$' -fuzz=FuzzDecode -fuzztime=1000000x ./pkg/codec

broker-start: ## start the test broker on 127.0.0.1:19092
	integration/kafka.sh start

broker-stop:
	integration/kafka.sh stop

bench: ## the router against a raw transactional passthrough, latency, restore, memory (bench/; real broker)
	$(GO) run ./bench $(BENCHFLAGS)
