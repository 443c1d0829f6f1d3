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
# Cluster mode: three combined broker+controller KRaft nodes on this machine,
# replication factor 3 by default, min.insync.replicas 2, the offsets and
# transaction state topics at replication 3 (min ISR 2), PLAINTEXT only. Node N
# (1-3) listens on cluster-port+N-1, its controller on cluster-port+10+N-1, and
# keeps its data and log in $FAULTROUTER_KAFKA_DIR/cluster/nodeN; each JVM has
# a 512 MiB heap. The same jars as the single broker.
#   integration/kafka.sh cluster start      format (once) and start the three nodes, wait until each is unfenced
#   integration/kafka.sh cluster stop       kill them and remove their data
#   integration/kafka.sh cluster kill N     SIGKILL node N (no controlled shutdown)
#   integration/kafka.sh cluster start N    start node N again on its data, wait until it is unfenced
#   integration/kafka.sh cluster restart N  SIGTERM node N, then start it again
#   integration/kafka.sh cluster status     exit 0 when all three nodes run
#   integration/kafka.sh cluster brokers    print the bootstrap addresses
#
# A second start while one runs reuses the running broker. Besides PLAINTEXT
# the broker has a SASL_SSL listener (SCRAM-SHA-512 over TLS) on port+2: start
# makes a test CA and the broker's PKCS12 keystore with keytool, and a SCRAM
# user with a random password with Kafka's storage tool, and writes what a
# client needs to $FAULTROUTER_KAFKA_DIR/sasl.env:
#   FAULTROUTER_TEST_SASL_BROKERS, FAULTROUTER_TEST_SASL_USER,
#   FAULTROUTER_TEST_SASL_PASSWORD, FAULTROUTER_TEST_TLS_CA (PEM)
# Environment:
#   FAULTROUTER_KAFKA_DIR       working directory (default /tmp/faultrouter-kafka)
#   FAULTROUTER_KAFKA_PORT      broker port (default 19092; the controller uses port+1)
#   FAULTROUTER_KAFKA_SASL_SSL  1 (default) for the SASL_SSL listener, 0 for PLAINTEXT only
#   FAULTROUTER_KAFKA_CLUSTER_PORT  cluster mode's first broker port (default port+100: 19192;
#                               below 32768, where clients' ephemeral ports may take one)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${FAULTROUTER_KAFKA_DIR:-/tmp/faultrouter-kafka}
port=${FAULTROUTER_KAFKA_PORT:-19092}
cport=$((port + 1))
sport=$((port + 2))
sasl=${FAULTROUTER_KAFKA_SASL_SSL:-1}
lib=$dir/lib
tlsdir=$dir/tls
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

secret() { head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9'; }

# tlsmaterial makes, once per storage (stop removes them), a test CA (ca.pem) and the
# broker's keystore (broker.p12: its key and a certificate for 127.0.0.1 and
# localhost signed by the CA), plus the passwords in sasl.env.
tlsmaterial() {
	if [[ -f $dir/sasl.env && -f $tlsdir/broker.p12 ]]; then
		return
	fi
	command -v keytool >/dev/null || { log "keytool not found: install a Java 17 JDK"; exit 1; }
	rm -rf "$tlsdir" && mkdir -p "$tlsdir"
	# keytool is a JVM per call: client JIT only and no GC threads make each cheaper
	local pw kt=(keytool -J-XX:TieredStopAtLevel=1 -J-XX:+UseSerialGC -J-XX:-UsePerfData)
	local gen=(-genkeypair -storetype PKCS12 -keyalg EC -groupname secp256r1 -validity 3650)
	pw=$(secret)
	# one chain of commands: set -e does not apply inside a list ending in ||
	{
		"${kt[@]}" "${gen[@]}" -keystore "$tlsdir/ca.p12" -storepass "$pw" -alias ca \
			-dname "CN=faultrouter test CA" -ext bc:c &&
		"${kt[@]}" -exportcert -keystore "$tlsdir/ca.p12" -storepass "$pw" -alias ca -rfc -file "$tlsdir/ca.pem" &&
		"${kt[@]}" "${gen[@]}" -keystore "$tlsdir/broker.p12" -storepass "$pw" -alias broker -dname "CN=127.0.0.1" &&
		"${kt[@]}" -certreq -keystore "$tlsdir/broker.p12" -storepass "$pw" -alias broker |
			"${kt[@]}" -gencert -keystore "$tlsdir/ca.p12" -storepass "$pw" -alias ca -validity 3650 -rfc \
				-ext SAN=ip:127.0.0.1,dns:localhost -ext EKU=serverAuth >"$tlsdir/broker.pem" &&
		# the signed certificate and the CA's: the chain the broker presents
		cat "$tlsdir/ca.pem" >>"$tlsdir/broker.pem" &&
		"${kt[@]}" -importcert -keystore "$tlsdir/broker.p12" -storepass "$pw" -alias broker -file "$tlsdir/broker.pem" -noprompt
	} >"$tlsdir/keytool.log" 2>&1 || { cat "$tlsdir/keytool.log" >&2; exit 1; }
	(
		umask 077
		cat >"$dir/sasl.env" <<ENV
FAULTROUTER_TEST_SASL_BROKERS=127.0.0.1:$sport
FAULTROUTER_TEST_SASL_USER=faultrouter
FAULTROUTER_TEST_SASL_PASSWORD=$(secret)
FAULTROUTER_TEST_TLS_CA=$tlsdir/ca.pem
KEYSTORE_PASSWORD=$pw
ENV
	)
}

# saslenv reads one value of sasl.env.
saslenv() { sed -n "s/^$1=//p" "$dir/sasl.env"; }

configure() {
	mkdir -p "$data"
	local listeners="PLAINTEXT://127.0.0.1:$port" protocols=PLAINTEXT:PLAINTEXT
	if [[ $sasl == 1 ]]; then
		listeners+=",SASL_SSL://127.0.0.1:$sport"
		protocols+=",SASL_SSL:SASL_SSL"
	fi
	cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=$listeners,CONTROLLER://127.0.0.1:$cport
advertised.listeners=$listeners
controller.listener.names=CONTROLLER
listener.security.protocol.map=$protocols,CONTROLLER:PLAINTEXT
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
# the log cleaner looks for work every second, not every 15 s: topics that a
# test gives a short segment.ms are compacted while it runs
log.cleaner.backoff.ms=1000
PROPS
	if [[ $sasl == 1 ]]; then
		cat >>"$dir/server.properties" <<PROPS
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$tlsdir/broker.p12
ssl.keystore.password=$(saslenv KEYSTORE_PASSWORD)
ssl.client.auth=none
PROPS
	fi
	logconfig "$dir/log4j2.properties" "$logfile"
}

# logconfig writes a log4j2 configuration to $1 that logs to the file $2.
logconfig() {
	cat >"$1" <<PROPS
status=warn
appender.file.type=File
appender.file.name=file
appender.file.fileName=$2
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
	if [[ $sasl == 1 && ! -f $dir/sasl.env && -f $data/meta.properties ]]; then
		log "the storage in $data was formatted without the SCRAM user: no SASL_SSL listener until kafka.sh stop"
		sasl=0
	fi
	if [[ $sasl == 1 ]]; then
		tlsmaterial
	else
		rm -f "$dir/sasl.env"
	fi
	configure
	local cp="$lib/*" jvm=(-Xms256m -Xmx1g -XX:+UseG1GC -Djava.awt.headless=true
		"-Dlog4j2.configurationFile=$dir/log4j2.properties" "-Dkafka.logs.dir=$dir")
	if [[ ! -f $data/meta.properties ]]; then
		local scram=()
		if [[ $sasl == 1 ]]; then
			# the SCRAM user goes into the cluster metadata when the storage is formatted
			scram=(--add-scram "SCRAM-SHA-512=[name=$(saslenv FAULTROUTER_TEST_SASL_USER),password=$(saslenv FAULTROUTER_TEST_SASL_PASSWORD)]")
		fi
		java "${jvm[@]}" -cp "$cp" kafka.tools.StorageTool format \
			-t "$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null)" \
			-c "$dir/server.properties" "${scram[@]}" >"$dir/format.log" 2>&1 ||
			{ cat "$dir/format.log" >&2; exit 1; }
	fi
	log "starting Apache Kafka $(ls "$lib" | sed -n 's/^kafka_2.13-\(.*\)\.jar$/\1/p') on 127.0.0.1:$port$([[ $sasl == 1 ]] && echo ", SASL_SSL on 127.0.0.1:$sport ($dir/sasl.env)") (log: $logfile)"
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
	rm -rf "$data" "$tlsdir" "$dir/sasl.env"
	log "broker stopped"
}

# Cluster mode: three combined broker+controller nodes.
cbase=${FAULTROUTER_KAFKA_CLUSTER_PORT:-$((port + 100))}
cdir=$dir/cluster
nodes=(1 2 3)

nport() { echo $((cbase + $1 - 1)); }       # node N's broker port
ncport() { echo $((cbase + 10 + $1 - 1)); } # node N's controller port
ndir() { echo "$cdir/node$1"; }
npid() { echo "$(ndir "$1")/broker.pid"; }

nrunning() {
	[[ -f $(npid "$1") ]] && kill -0 "$(cat "$(npid "$1")")" 2>/dev/null
}

nanswers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$(nport "$1")") 2>/dev/null
}

cbrokers() {
	local n out=()
	for n in "${nodes[@]}"; do out+=("127.0.0.1:$(nport "$n")"); done
	(IFS=,; echo "${out[*]}")
}

cjvm=(-Xms128m -Xmx512m -XX:+UseG1GC -XX:ParallelGCThreads=1 -XX:ConcGCThreads=1 -Djava.awt.headless=true)

nconfigure() {
	local n=$1 d voters="" m
	d=$(ndir "$n")
	mkdir -p "$d/data"
	for m in "${nodes[@]}"; do voters+="${voters:+,}$m@127.0.0.1:$(ncport "$m")"; done
	cat >"$d/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(nport "$n"),CONTROLLER://127.0.0.1:$(ncport "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(nport "$n")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$d/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=6
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.segment.bytes=67108864
transaction.partition.verification.enable=true
log.cleaner.backoff.ms=1000
# three JVMs share the machine: fewer threads each
num.network.threads=2
num.io.threads=4
background.threads=4
PROPS
	logconfig "$d/log4j2.properties" "$d/broker.log"
}

# nlaunch starts node N in the background on its formatted data.
nlaunch() {
	local n=$1 d
	d=$(ndir "$n")
	if nrunning "$n"; then
		return
	fi
	if nanswers "$n"; then
		log "port $(nport "$n") is taken by a process this script did not start; set FAULTROUTER_KAFKA_CLUSTER_PORT"
		exit 1
	fi
	# where this start's lines begin: the log is appended to across restarts
	if [[ -f $d/broker.log ]]; then wc -l <"$d/broker.log" >"$d/log.mark"; else echo 0 >"$d/log.mark"; fi
	setsid java "${cjvm[@]}" "-Dlog4j2.configurationFile=$d/log4j2.properties" "-Dkafka.logs.dir=$d" \
		-cp "$lib/*" kafka.Kafka "$d/server.properties" >>"$d/stdout.log" 2>&1 </dev/null 9>&- &
	echo $! >"$(npid "$n")"
}

# nready reports whether node N answers and logged, since its last start,
# that it is unfenced and started.
nready() {
	local d
	d=$(ndir "$1")
	nanswers "$1" && tail -n "+$(($(cat "$d/log.mark") + 1))" "$d/broker.log" 2>/dev/null | grep -q "Kafka Server started"
}

# nwait waits until every node named is ready.
nwait() {
	local i n left
	for ((i = 0; i < 360; i++)); do
		left=()
		for n in "$@"; do
			if ! nrunning "$n"; then
				log "node $n exited during start-up:"
				tail -n 40 "$(ndir "$n")/stdout.log" "$(ndir "$n")/broker.log" >&2 || true
				exit 1
			fi
			nready "$n" || left+=("$n")
		done
		if ((${#left[@]} == 0)); then
			log "node(s) $* ready after $((i / 2)) s"
			return
		fi
		sleep 0.5
	done
	log "node(s) ${left[*]} did not start within 180 s"
	exit 1
}

nhalt() {
	local n=$1 pid i
	nrunning "$n" || { rm -f "$(npid "$n")"; return; }
	pid=$(cat "$(npid "$n")")
	kill "$pid" 2>/dev/null || true
	for ((i = 0; i < 60; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "node $n did not stop in 30 s; killing it"
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$(npid "$n")"
}

nkill() {
	local n=$1 pid i
	nrunning "$n" || { log "node $n is not running"; exit 1; }
	pid=$(cat "$(npid "$n")")
	kill -9 "$pid"
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	rm -f "$(npid "$n")"
	log "node $n (127.0.0.1:$(nport "$n")) killed with SIGKILL"
}

cstart() {
	mkdir -p "$cdir"
	exec 9>"$cdir/lock"
	flock -w 300 9 || { log "another start holds $cdir/lock"; exit 1; }
	command -v java >/dev/null || { log "java not found: install a Java 17 JDK"; exit 1; }
	command -v mvn >/dev/null || { log "mvn not found: install Maven"; exit 1; }
	resolve
	local n cp="$lib/*" pids=()
	[[ -f $cdir/cluster.id ]] || java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null >"$cdir/cluster.id"
	for n in "${nodes[@]}"; do
		nconfigure "$n"
		if [[ ! -f $(ndir "$n")/data/meta.properties ]]; then
			java "${cjvm[@]}" -cp "$cp" kafka.tools.StorageTool format -t "$(cat "$cdir/cluster.id")" \
				-c "$(ndir "$n")/server.properties" >"$(ndir "$n")/format.log" 2>&1 &
			pids+=($!)
		fi
	done
	for n in "${pids[@]}"; do
		wait "$n" || { cat "$cdir"/node*/format.log >&2; exit 1; }
	done
	log "starting a three-node Apache Kafka cluster on $(cbrokers) (logs: $cdir/node*/broker.log)"
	# all at once: a node's start waits for a quorum of the three
	for n in "${nodes[@]}"; do nlaunch "$n"; done
	nwait "${nodes[@]}"
	cbrokers
}

cstop() {
	local n
	# SIGKILL: their data goes with them, and a controlled shutdown of the
	# last nodes waits for a quorum that the first ones took away
	for n in "${nodes[@]}"; do
		if nrunning "$n"; then nkill "$n" 2>/dev/null; fi
	done
	rm -rf "$cdir"
	log "cluster stopped"
}

cnode() {
	[[ ${1:-} =~ ^[123]$ ]] || { log "cluster $2: want a node number, 1, 2 or 3, got '${1:-}'"; exit 2; }
}

cluster() {
	case ${1:-} in
	start)
		if [[ -n ${2:-} ]]; then
			cnode "$2" start
			[[ -f $(ndir "$2")/data/meta.properties ]] || { log "node $2 has no data: run kafka.sh cluster start first"; exit 1; }
			nconfigure "$2"
			nlaunch "$2"
			nwait "$2"
		else
			cstart
		fi
		;;
	stop) cstop ;;
	kill) cnode "${2:-}" kill; nkill "$2" ;;
	restart) cnode "${2:-}" restart; nhalt "$2"; nlaunch "$2"; nwait "$2" ;;
	status) for n in "${nodes[@]}"; do nrunning "$n" || exit 1; done ;;
	brokers) cbrokers ;;
	*) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
	esac
}

case ${1:-} in
start) start ;;
stop) stop ;;
restart) halt; start ;;
status) running ;;
brokers) echo "127.0.0.1:$port" ;;
cluster) shift; cluster "$@" ;;
*) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
