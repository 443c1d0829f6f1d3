#!/usr/bin/env bash
# Builds the Kafka Streams peer of `make bench` and prints the classpath to run
# StreamsPeer with: resolves pom.xml's dependencies from Maven Central (cached
# in ~/.m2) with `mvn dependency:build-classpath` and compiles src/*.java with
# javac, as integration/interop.sh builds the Java wire check. Redone only when
# pom.xml or the sources change (a hash of them is kept beside the result).
# Environment: FAULTROUTER_PEER_DIR, the cache directory (default
# ~/.cache/faultrouter-streams-peer).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${FAULTROUTER_PEER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/faultrouter-streams-peer}
want=$(cat "$here/pom.xml" "$here"/src/*.java | sha256sum | cut -d' ' -f1)
if [[ ! -f $dir/.stamp || $(cat "$dir/.stamp") != "$want" ]]; then
	printf 'streams-peer/build.sh: resolving Kafka Streams from Maven Central and compiling the peer\n' >&2
	rm -rf "$dir"
	mkdir -p "$dir/classes"
	mvn -q -B -Dstyle.color=never -f "$here/pom.xml" dependency:build-classpath -Dmdep.outputFile="$dir/deps.txt" >&2
	javac -nowarn --release 17 -d "$dir/classes" -cp "$(cat "$dir/deps.txt")" "$here"/src/*.java >&2
	echo "$want" >"$dir/.stamp"
fi
echo "$dir/classes:$(cat "$dir/deps.txt")"
