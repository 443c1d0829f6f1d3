#!/usr/bin/env bash
# Prepares the other languages the integration tests check the wire format
# with, and caches them so that a second run costs nothing:
#
#   integration/interop.sh java     resolve Java Avro (integration/java/pom.xml, from Maven
#                                   Central, cached in ~/.m2), compile integration/java/src
#                                   with javac; prints the classpath to run WireCheck with
#   integration/interop.sh python   make a virtual environment with the Python package's pinned
#                                   test requirements (clients/python/requirements-test.txt, from
#                                   PyPI) and `pip install ./clients/python`; prints its python
#
# Each is redone only when its inputs change (a hash of them is kept beside the
# result). Environment: FAULTROUTER_INTEROP_DIR, the cache directory (default
# ~/.cache/faultrouter-interop).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${FAULTROUTER_INTEROP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/faultrouter-interop}
mkdir -p "$cache"

log() { printf 'interop.sh: %s\n' "$*" >&2; }

# stamp prints one hash of the given files' contents.
stamp() { cat "$@" | sha256sum | cut -d' ' -f1; }

java_setup() {
	local dir=$cache/java want
	want=$(stamp "$root/integration/java/pom.xml" "$root"/integration/java/src/*.java)
	if [[ ! -f $dir/.stamp || $(cat "$dir/.stamp") != "$want" ]]; then
		log "resolving Java Avro from Maven Central and compiling integration/java"
		rm -rf "$dir"
		mkdir -p "$dir/classes"
		mvn -q -B -f "$root/integration/java/pom.xml" dependency:build-classpath \
			-Dmdep.outputFile="$dir/deps.txt" >&2
		javac -nowarn -d "$dir/classes" -cp "$(cat "$dir/deps.txt")" "$root"/integration/java/src/*.java >&2
		echo "$want" >"$dir/.stamp"
	fi
	echo "$dir/classes:$(cat "$dir/deps.txt")"
}

python_setup() {
	local dir=$cache/venv pkg=$root/clients/python want have py
	local req=$pkg/requirements-test.txt
	py=$(command -v python3.11 || command -v python3)
	want=$(stamp "$req"; "$py" --version)
	if [[ ! -f $dir/.stamp || $(cat "$dir/.stamp") != "$want" ]]; then
		log "creating a virtual environment with $(basename "$req") from PyPI"
		rm -rf "$dir"
		"$py" -m venv "$dir"
		"$dir/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
		echo "$want" >"$dir/.stamp"
	fi
	# the package itself, reinstalled (without its dependencies) when its files change;
	# hatchling, the build backend, is pinned in the test requirements
	have=$(cd "$pkg" && find pyproject.toml README.md src -type f ! -name '*.pyc' | sort | xargs cat | sha256sum | cut -d' ' -f1)
	if [[ ! -f $dir/.package || $(cat "$dir/.package") != "$have" ]]; then
		log "installing ./clients/python into the virtual environment"
		"$dir/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$pkg" >&2
		echo "$have" >"$dir/.package"
	fi
	echo "$dir/bin/python"
}

case ${1:-} in
java) java_setup ;;
python) python_setup ;;
*)
	echo "usage: $0 java|python" >&2
	exit 2
	;;
esac
