#!/usr/bin/env bash
# Lints and renders the Helm chart with helm built from the Go module proxy,
# then checks the rendered objects with the Go test in this directory.
# HELM=/path/to/helm skips the build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

helm_version=${HELM_VERSION:-v3.22.0}
if [[ -z ${HELM:-} ]]; then
	bin=${HELM_BIN_DIR:-${TMPDIR:-/tmp}/faultrouter-helm-$helm_version}
	if [[ ! -x $bin/helm ]]; then
		echo "building helm $helm_version from the Go module proxy into $bin"
		mkdir -p "$bin"
		GOBIN=$bin go install "helm.sh/helm/v3/cmd/helm@$helm_version"
	fi
	HELM=$bin/helm
fi
export HELM

"$HELM" lint --strict faultrouter
"$HELM" template fr faultrouter >/dev/null
"$HELM" template fr faultrouter --set metrics.serviceMonitor.enabled=true \
	--set kafka.user=u --set kafka.password=p --set-string policy='version: 1' >/dev/null
"$HELM" lint --strict faultrouter --set console.enabled=true --set-string console.users='users: []' \
	--set console.ingress.enabled=true
"$HELM" template fr faultrouter --set console.enabled=true --set-string console.users='users: []' \
	--set console.ingress.enabled=true >/dev/null
"$HELM" lint --strict faultrouter --set console.enabled=true --set console.trustProxyHeader=true \
	--set 'console.trustedProxies={10.42.0.0/16}' --set console.networkPolicy.from[0].podSelector.matchLabels.app=oauth2-proxy
go test -count=1 .
