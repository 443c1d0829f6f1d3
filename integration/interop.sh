#!/usr/bin/env bash
# Prepares the other languages the integration tests check the wire format
# with, and caches them so that a second run costs nothing:
#
#   integration/interop.sh java     resolve Java Avro (integration/java/pom.xml, from Maven
#                                   Central, cached in ~/.m2), compile integration/java/src
#                                   with javac; prints the classpath to run WireCheck with
#   integration/interop.sh python [3.N]
#                                   make a virtual environment with the Python package's pinned
#                                   test requirements (clients/python/requirements-test.txt, from
#                                   PyPI) and `pip install ./clients/python`; prints its python.
#                                   With 3.N, on that Python (python3.N on the PATH, or pyenv's);
#                                   without, on python3.11, or python3. Exit status 3: no Python
#                                   3.N on this machine
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

# find_python prints the path of an interpreter of Python $1 (3.N) that runs:
# python3.N on the PATH, or one pyenv installed (pyenv's shims run only the
# versions it has selected).
find_python() {
	local c
	for c in "$(command -v "python$1" 2>/dev/null)" "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/"python$1" /usr/bin/"python$1"; do
		if [[ -x $c ]] && "$c" -c 'import sys; sys.exit(sys.version_info[:2] != tuple(map(int, sys.argv[1].split("."))))' "$1" 2>/dev/null; then
			echo "$c"
			return
		fi
	done
	return 1
}

python_setup() {
	local dir=$cache/venv pkg=$root/clients/python want have py
	local req=$pkg/requirements-test.txt
	if [[ -n ${1:-} ]]; then
		py=$(find_python "$1") || {
			log "no Python $1 on this machine"
			exit 3
		}
		dir=$cache/venv-$1
	elif py=$(find_python 3.11); then
		dir=$cache/venv-3.11 # the one `python 3.11` makes
	else
		py=$(command -v python3)
	fi
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
python) python_setup "${2:-}" ;;
*)
	echo "usage: $0 java|python [3.N]" >&2
	exit 2
	;;
esac
