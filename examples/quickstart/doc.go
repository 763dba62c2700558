// Command quickstart shows userproxy working, as root, without touching the
// machine's own network: it starts three TCP endpoints and a UDP endpoint on
// loopback addresses inside a fresh network namespace, runs the userproxy
// binary there with examples/quickstart.yaml, makes 1000 connections to the
// ClusterIP 10.96.0.10:80 and one UDP exchange with 10.96.0.53:53, prints the
// split per endpoint, the conntrack table and the metrics that matter, and
// removes everything it made.
//
//	sudo "$(command -v go)" run ./examples/quickstart
package main
