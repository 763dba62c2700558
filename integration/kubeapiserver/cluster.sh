#!/usr/bin/env bash
# cluster.sh runs a throwaway Kubernetes control plane on loopback: etcd and
# kube-apiserver on random 127.0.0.1 ports, state in a tmpfs directory.
#
#   cluster.sh up [DIR]   build or reuse kube-apiserver (build.sh), start
#                         etcd + kube-apiserver, wait for /readyz, print
#                         KUBECONFIG=DIR/kubeconfig (admin, system:masters)
#   cluster.sh down DIR   stop them (SIGTERM to the PID in DIR/kube-up.pid),
#                         wait, and remove DIR
#
# There is no controller-manager: create EndpointSlices yourself. etcd comes
# from `apt-get install etcd-server` (or USERPROXY_ETCD).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"

# alive PID: the process exists and is not a zombie.
alive() {
	[ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

case "${1:-}" in
up)
	dir="${2:-}"
	if [ -z "$dir" ]; then
		base=/dev/shm
		[ -d "$base" ] || base="${TMPDIR:-/tmp}"
		dir="$(mktemp -d "$base/userproxy-kube.XXXXXX")"
	fi
	mkdir -p "$dir"
	dir="$(cd "$dir" && pwd)"
	if [ -f "$dir/kube-up.pid" ] && alive "$(cat "$dir/kube-up.pid")"; then
		echo "cluster.sh: already running in $dir (PID $(cat "$dir/kube-up.pid"))" >&2
		exit 1
	fi
	USERPROXY_KUBE_APISERVER="$("$here/build.sh")"
	export USERPROXY_KUBE_APISERVER
	(cd "$root" && go build -o "$dir/kube-up" ./integration/kubeapi/kube-up)
	rm -f "$dir/ready"
	setsid "$dir/kube-up" -dir "$dir" >"$dir/kube-up.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid" >"$dir/kube-up.pid"
	for _ in $(seq 1200); do
		[ -f "$dir/ready" ] && break
		if ! alive "$pid"; then
			echo "cluster.sh: kube-up exited:" >&2
			cat "$dir/kube-up.log" >&2
			exit 1
		fi
		sleep 0.1
	done
	if [ ! -f "$dir/ready" ]; then
		echo "cluster.sh: not ready after 120 s; see $dir/*.log" >&2
		kill "$pid" || true
		exit 1
	fi
	echo "KUBE_UP_DIR=$dir"
	echo "KUBE_UP_PID=$pid"
	cat "$dir/ready"
	;;
down)
	dir="${2:?usage: cluster.sh down DIR}"
	pid="$(cat "$dir/kube-up.pid")"
	if alive "$pid"; then
		kill -TERM "$pid"
		for _ in $(seq 300); do
			alive "$pid" || break
			sleep 0.1
		done
		if alive "$pid"; then
			echo "cluster.sh: PID $pid still running after 30 s" >&2
			exit 1
		fi
	fi
	rm -rf -- "$dir"
	;;
*)
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
