#!/usr/bin/env bash
# Starts and stops the real schema registry that faultrouter's Schema Registry
# tests run against: Apicurio Registry, whose Confluent-compatible API
# (/apis/ccompat/v7) is what faultrouter's --registry-url talks to. It is
# resolved from Maven Central (integration/registry/pom.xml, cached in ~/.m2),
# unpacked once, and run on 127.0.0.1 only, on a JDK of version 21 or newer.
# With FAULTROUTER_REGISTRY_KAFKA its schemas are stored in Kafka (Apicurio's
# kafkasql storage: a journal topic, as registries are run in production),
# else in an H2 database file under the working directory; a restart keeps
# them either way.
#
#   integration/registry.sh start    resolve and unpack (cached), start, wait until it answers
#   integration/registry.sh stop     stop it and remove its schemas
#   integration/registry.sh halt     stop it, keeping its schemas (for registry-outage tests)
#   integration/registry.sh status   exit 0 when a registry started by this script is running
#   integration/registry.sh url      print its base URL (the Confluent-compatible API)
#   integration/registry.sh java     print the JDK's java it runs on; exit 1 when there is none
#
# Environment:
#   FAULTROUTER_REGISTRY_DIR    working directory (default /tmp/faultrouter-registry)
#   FAULTROUTER_REGISTRY_PORT   HTTP port (default 18081; the management port is port+10)
#   FAULTROUTER_REGISTRY_JAVA   the java to run it with (default: the newest JDK 21+ found
#                               in JAVA_HOME, /usr/lib/jvm or PATH)
#   FAULTROUTER_REGISTRY_KAFKA  bootstrap servers of the Kafka that stores the schemas, in
#                               topics faultrouter-registry-<random>-*: start after stop
#                               uses new ones, start after halt the same
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${FAULTROUTER_REGISTRY_DIR:-/tmp/faultrouter-registry}
port=${FAULTROUTER_REGISTRY_PORT:-18081}
mport=$((port + 10))
app=$dir/app
pidfile=$dir/registry.pid
logfile=$dir/registry.log
url=http://127.0.0.1:$port/apis/ccompat/v7

log() { printf 'registry.sh: %s\n' "$*" >&2; }

running() {
	[[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

answers() {
	curl -fsS -o /dev/null --max-time 2 "$url/subjects" 2>/dev/null
}

# ready tells whether the registry answers and its storage is ready (its
# management port's readiness checks): with kafkasql storage the API answers
# before the journal has been read back after a restart.
ready() {
	answers && curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$mport/health/ready" 2>/dev/null
}

# major prints the major Java version of the java binary $1 ("" if unknown).
major() {
	local home release
	home=$(dirname "$(dirname "$(readlink -f "$1")")")
	release=$home/release
	if [[ -f $release ]]; then
		sed -n 's/^JAVA_VERSION="\([0-9]*\).*/\1/p' "$release"
		return
	fi
	"$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = \([0-9]*\).*/\1/p'
}

# findjava prints a java of version 21 or newer, the newest found.
findjava() {
	if [[ -n ${FAULTROUTER_REGISTRY_JAVA:-} ]]; then
		echo "$FAULTROUTER_REGISTRY_JAVA"
		return
	fi
	local best="" bestv=0 j v
	for j in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} /usr/lib/jvm/*/bin/java "$(command -v java || true)"; do
		[[ -x $j ]] || continue
		v=$(major "$j")
		if [[ -n $v && $v -ge 21 && $v -gt $bestv ]]; then
			best=$j bestv=$v
		fi
	done
	[[ -n $best ]] || return 1
	echo "$best"
}

resolve() {
	local stamp tgz
	stamp=$(sha256sum "$here/registry/pom.xml" | cut -d' ' -f1)
	if [[ -f $app/.stamp && $(cat "$app/.stamp") == "$stamp" ]]; then
		return
	fi
	log "resolving Apicurio Registry from Maven Central (about 160 MB; uses ~/.m2 as cache)"
	rm -rf "$app" "$dir/dl"
	mvn -q -B -f "$here/registry/pom.xml" dependency:copy-dependencies \
		-DoutputDirectory="$dir/dl" -DincludeScope=runtime >&2
	tgz=$(ls "$dir"/dl/apicurio-registry-app-*.tar.gz)
	mkdir -p "$app"
	tar xzf "$tgz" -C "$app"
	rm -rf "$dir/dl"
	echo "$stamp" >"$app/.stamp"
}

start() {
	mkdir -p "$dir"
	exec 9>"$dir/lock"
	flock -w 600 9 || { log "another start holds $dir/lock"; exit 1; }
	if running; then
		log "reusing the registry already running (pid $(cat "$pidfile")) at $url"
		echo "$url"
		return
	fi
	if answers; then
		log "port $port is taken by a process this script did not start; set FAULTROUTER_REGISTRY_PORT"
		exit 1
	fi
	local java
	java=$(findjava) || { log "no JDK 21 or newer found (Apicurio Registry needs one): install one or set FAULTROUTER_REGISTRY_JAVA"; exit 1; }
	command -v mvn >/dev/null || { log "mvn not found: install Maven"; exit 1; }
	command -v curl >/dev/null || { log "curl not found: install curl (it asks the registry whether it is up)"; exit 1; }
	resolve
	local storage=(-Dapicurio.datasource.url="jdbc:h2:file:$dir/db/registry")
	if [[ -n ${FAULTROUTER_REGISTRY_KAFKA:-} ]]; then
		# one journal per start after a stop (halt keeps it): its name is kept in $dir
		[[ -f $dir/kafkasql ]] || echo "faultrouter-registry-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$dir/kafkasql"
		local t
		t=$(cat "$dir/kafkasql")
		storage=(-Dapicurio.storage.kind=kafkasql -Dapicurio.kafkasql.bootstrap.servers="$FAULTROUTER_REGISTRY_KAFKA"
			-Dapicurio.kafkasql.topic="$t-journal" -Dapicurio.kafkasql.snapshots.topic="$t-snapshots"
			-Dapicurio.events.kafka.topic="$t-events")
	fi
	log "starting Apicurio Registry on 127.0.0.1:$port with $java, storage ${FAULTROUTER_REGISTRY_KAFKA:+kafkasql on }${FAULTROUTER_REGISTRY_KAFKA:-H2 in $dir/db} (log: $logfile)"
	# everything on loopback: the HTTP API and the management interface
	# (health, metrics), which otherwise listens on all addresses at 9000
	setsid "$java" -Xms64m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
		-Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
		-Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
		-Dquarkus.log.file.enable=false -Dquarkus.console.color=false \
		"${storage[@]}" \
		-jar "$app/quarkus-run.jar" >"$logfile" 2>&1 </dev/null 9>&- &
	echo $! >"$pidfile"
	local i
	for ((i = 0; i < 240; i++)); do
		if ! running; then
			log "the registry exited during start-up:"
			tail -n 40 "$logfile" >&2 || true
			exit 1
		fi
		if ready; then
			log "registry ready after $((i / 2)) s"
			echo "$url"
			return
		fi
		sleep 0.5
	done
	log "the registry did not answer within 120 s"
	stop
	exit 1
}

halt() {
	if running; then
		local pid i
		pid=$(cat "$pidfile")
		kill "$pid" 2>/dev/null || true
		for ((i = 0; i < 60; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.5
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "registry did not stop in 30 s; killing it"
			kill -9 "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$pidfile"
}

stop() {
	halt
	rm -rf "$dir/db" "$dir/kafkasql"
	log "registry stopped"
}

case ${1:-} in
start) start ;;
stop) stop ;;
halt) halt ;;
status) running ;;
url) echo "$url" ;;
java) findjava ;;
*) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
