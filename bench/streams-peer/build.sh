#!/usr/bin/env bash
# Builds the Kafka Streams peer of `make bench` and prints the classpath to run
# StreamsPeer with: resolves pom.xml's dependencies from Maven Central (cached
# in ~/.m2) with `mvn dependency:build-classpath` and compiles src/*.java with
# javac, as integration/interop.sh builds the Java wire check. A build is kept
# under a hash of pom.xml and the sources and redone only when they change; it
# is made in a temporary directory and renamed into place, so that benches
# running at once do not see each other's half-made builds.
# Environment: FAULTROUTER_PEER_DIR, the cache directory (default
# ~/.cache/faultrouter-streams-peer).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${FAULTROUTER_PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/faultrouter-streams-peer}
want=$(cat "$here/pom.xml" "$here"/src/*.java | sha256sum | cut -d' ' -f1)
dir=$cache/$want
if [[ ! -f $dir/deps.txt ]]; then
	printf 'streams-peer/build.sh: resolving Kafka Streams from Maven Central and compiling the peer\n' >&2
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	chmod 755 "$tmp"
	mkdir -p "$tmp/classes"
	if ! mvn -q -B -f "$here/pom.xml" dependency:build-classpath -Dmdep.outputFile="$tmp/deps.txt" >"$tmp/mvn.log" 2>&1; then
		cat "$tmp/mvn.log" >&2
		exit 1
	fi
	javac -nowarn --release 17 -d "$tmp/classes" -cp "$(cat "$tmp/deps.txt")" "$here"/src/*.java >&2
	# another build of the same sources may have landed first: keep that one
	mv -T "$tmp" "$dir" 2>/dev/null || true
fi
echo "$dir/classes:$(cat "$dir/deps.txt")"
