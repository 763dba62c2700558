package main

// What each command's --help says before its flags: what it does, and
// examples.

const runAbout = `userproxy run: serve Services' ClusterIPs (and NodePorts, external and
load-balancer IPs) through a TUN device, with kube-proxy's endpoint
selection, without netfilter. Objects come from a file or directory of
Services and EndpointSlices (--config, reloaded on change), or from the API
server (--kubeconfig, or in cluster).

Examples:
  sudo userproxy run --config services.yaml
  sudo userproxy run --kubeconfig ~/.kube/config --service-cidr 10.96.0.0/12
  userproxy run --config services.yaml --tun-name userproxy0   # after userproxy setup --user $USER
`

const setupAbout = `userproxy setup: create a persistent TUN device owned by a user (root, once),
so that userproxy run needs no privileges; --remove deletes it.

Examples:
  sudo userproxy setup --user $USER
  sudo userproxy setup --remove
`

const restartAbout = `userproxy restart: restart a running proxy without resetting its connections:
it gets SIGHUP, starts its binary again (the file now at its path: an
upgrade), and hands its TUN and flows to the new process, which then serves
(docs/handover.md). Linux.

Examples:
  sudo userproxy restart
  sudo userproxy restart --tun-name userproxy1
`

const conntrackAbout = `userproxy conntrack list|flush: the connection tracking table of a running
proxy, one conntrack -L line per flow; flush deletes the entries selected
(all of them without a filter), resetting their flows.

Examples:
  userproxy conntrack list --protocol tcp
  userproxy conntrack flush --service default/web:80
`

const rulesAbout = `userproxy rules: the iptables-save lines kube-proxy would write for the same
objects, from a file (--config) or a running proxy.

Examples:
  userproxy rules --config services.yaml
  userproxy rules --format restore --jump-rules
`

const ipvsAbout = `userproxy ipvs: the service table of a running proxy as ipvsadm -Ln lists it.

Examples:
  userproxy ipvs
  userproxy ipvs --stats
`

const demoAbout = `userproxy demo: the endpoint lottery and ClientIP affinity on simulated
connections, without a TUN or root.

Examples:
  userproxy demo --endpoints 3 --connections 10000
`
