#!/usr/bin/env bash
# build.sh builds kube-apiserver from this module, or reuses the binary it
# built before, and prints the binary's path on stdout (progress goes to
# stderr). Idempotent: a second run with the same sources costs a second.
#
# The cache is keyed by the pinned Kubernetes version:
#   $USERPROXY_KUBE_CACHE (default /var/cache/userproxy)/kube-apiserver-<version>/kube-apiserver
# next to a stamp, the SHA-256 of go.mod, go.sum and the Go files; a changed
# module rebuilds. USERPROXY_KUBE_APISERVER names a binary to use instead
# (nothing is built then).
#
# The first build takes 10-15 minutes on 2 cores and about 4 GB of Go build
# cache; run nothing else heavy beside it.
set -euo pipefail
cd "$(dirname "$0")"

if [ -n "${USERPROXY_KUBE_APISERVER:-}" ]; then
	if [ ! -x "$USERPROXY_KUBE_APISERVER" ]; then
		echo "build.sh: USERPROXY_KUBE_APISERVER=$USERPROXY_KUBE_APISERVER is not an executable file" >&2
		exit 1
	fi
	echo "$USERPROXY_KUBE_APISERVER"
	exit 0
fi

export PATH="/usr/local/go/bin:$PATH"
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == "k8s.io/kubernetes" {print $3; exit}' go.mod)
if [[ ! "$version" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]]; then
	echo "build.sh: no k8s.io/kubernetes release pinned in go.mod (found '$version')" >&2
	exit 1
fi
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}

dir="${USERPROXY_KUBE_CACHE:-/var/cache/userproxy}/kube-apiserver-$version"
bin="$dir/kube-apiserver"
stamp=$(cat go.mod go.sum ./*.go | sha256sum | cut -d' ' -f1)

if [ -x "$bin" ] && [ "$(cat "$dir/stamp" 2>/dev/null)" = "$stamp" ]; then
	echo "build.sh: reusing $bin" >&2
	echo "$bin"
	exit 0
fi

echo "build.sh: building kube-apiserver $version into $bin (10-15 minutes the first time)" >&2
mkdir -p "$dir"
pkg=k8s.io/component-base/version
start=$(date +%s)
# -mod=readonly: go.mod and go.sum are committed and used as they are.
CGO_ENABLED=0 go build -mod=readonly -trimpath -buildvcs=false \
	-ldflags "-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z" \
	-o "$bin.tmp" .
"$bin.tmp" --version >&2
mv -f "$bin.tmp" "$bin"
echo "$stamp" >"$dir/stamp"
echo "build.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$bin"
