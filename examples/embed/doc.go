// Command embed shows userproxy as a library: a program that needs working
// ClusterIPs for its own connections builds the datapath in-process (an
// in-memory link, no TUN, no privileges), feeds it Services and
// EndpointSlices, and dials a ClusterIP with Stack.DialContext.
//
//	go run ./examples/embed
package main
