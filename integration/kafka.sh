#!/usr/bin/env bash
# Starts and stops the real Apache Kafka broker that faultrouter's integration
# tests run against: one combined broker+controller in KRaft mode on 127.0.0.1,
# resolved with its dependencies from Maven Central (integration/kafka/pom.xml)
# and run with the machine's Java 17.
#
#   integration/kafka.sh start    resolve jars (cached), format storage, start, wait until it answers
#   integration/kafka.sh stop     stop it and remove its data
#   integration/kafka.sh restart  stop and start again, keeping the data (for broker-restart tests)
#   integration/kafka.sh status   exit 0 when a broker started by this script is running
#   integration/kafka.sh brokers  print the bootstrap address
#
# A second start while one runs reuses the running broker. Environment:
#   FAULTROUTER_KAFKA_DIR   working directory (default /tmp/faultrouter-kafka)
#   FAULTROUTER_KAFKA_PORT  broker port (default 19092; the controller uses port+1)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${FAULTROUTER_KAFKA_DIR:-/tmp/faultrouter-kafka}
port=${FAULTROUTER_KAFKA_PORT:-19092}
cport=$((port + 1))
lib=$dir/lib
data=$dir/data
pidfile=$dir/broker.pid
logfile=$dir/broker.log

log() { printf 'kafka.sh: %s\n' "$*" >&2; }

running() {
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

answers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

resolve() {
	local stamp
	stamp=$(sha256sum "$here/kafka/pom.xml" | cut -d' ' -f1)
	if [[ -f $lib/.stamp && $(cat "$lib/.stamp") == "$stamp" ]]; then
		return
	fi
	log "resolving Apache Kafka jars from Maven Central (uses ~/.m2 as cache)"
	rm -rf "$lib"
	mvn -q -B -f "$here/kafka/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$lib" -DincludeScope=runtime >&2
	echo "$stamp" >"$lib/.stamp"
}

configure() {
	mkdir -p "$data"
	cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$data
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=6
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.segment.bytes=67108864
transaction.partition.verification.enable=true
PROPS
	cat >"$dir/log4j2.properties" <<PROPS
status=warn
appender.file.type=File
appender.file.name=file
appender.file.fileName=$logfile
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=[%d] %p %m (%c)%n
rootLogger.level=INFO
rootLogger.appenderRef.file.ref=file
logger.kafka.name=kafka
logger.kafka.level=INFO
logger.org.name=org.apache.kafka
logger.org.level=WARN
logger.state.name=state.change.logger
logger.state.level=WARN
PROPS
}

start() {
	mkdir -p "$dir"
	exec 9>"$dir/lock"
	flock -w 300 9 || { log "another start holds $dir/lock"; exit 1; }
	if running; then
		log "reusing the broker already running (pid $(cat "$pidfile")) on 127.0.0.1:$port"
		echo "127.0.0.1:$port"
		return
	fi
	if answers; then
		log "port $port is taken by a process this script did not start; set FAULTROUTER_KAFKA_PORT"
		exit 1
	fi
	command -v java >/dev/null || { log "java not found: install a Java 17 JDK"; exit 1; }
	command -v mvn >/dev/null || { log "mvn not found: install Maven"; exit 1; }
	resolve
	configure
	local cp="$lib/*" jvm=(-Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true
		"-Dlog4j2.configurationFile=$dir/log4j2.properties" "-Dkafka.logs.dir=$dir")
	if [[ ! -f $data/meta.properties ]]; then
		java "${jvm[@]}" -cp "$cp" kafka.tools.StorageTool format \
			-t "$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null)" \
			-c "$dir/server.properties" >"$dir/format.log" 2>&1 ||
			{ cat "$dir/format.log" >&2; exit 1; }
	fi
	log "starting Apache Kafka $(ls "$lib" | sed -n 's/^kafka_2.13-\(.*\)\.jar$/\1/p') on 127.0.0.1:$port (log: $logfile)"
	setsid java "${jvm[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" \
		>"$dir/stdout.log" 2>&1 </dev/null 9>&- &
	echo $! >"$pidfile"
	local i
	for ((i = 0; i < 240; i++)); do
		if ! running; then
			log "the broker exited during start-up:"
			tail -n 40 "$dir/stdout.log" "$logfile" >&2 || true
			exit 1
		fi
		if answers && grep -q "Kafka Server started" "$logfile" 2>/dev/null; then
			log "broker ready after $((i / 2)) s"
			echo "127.0.0.1:$port"
			return
		fi
		sleep 0.5
	done
	log "the broker did not answer within 120 s"
	stop
	exit 1
}

halt() {
	if ! running; then
		rm -f "$pidfile"
		return
	fi
	local pid i
	pid=$(cat "$pidfile")
	kill "$pid" 2>/dev/null || true
	for ((i = 0; i < 60; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "broker did not stop in 30 s; killing it"
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
}

stop() {
	halt
	rm -rf "$data"
	log "broker stopped"
}

case ${1:-} in
start) start ;;
stop) stop ;;
restart) halt; start ;;
status) running ;;
brokers) echo "127.0.0.1:$port" ;;
*) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
