// Package handover moves a running proxy to the process that replaces it
// (a restart, an upgrade, a rolling update of the DaemonSet) without
// ending its connections: the descriptors the old process holds (TUN
// queues, listening sockets, every flow's endpoint socket) pass over a
// root-only unix socket with SCM_RIGHTS, and its state passes as a
// snapshot in a versioned, checksummed format.
//
// Who calls it: the binary's run command. The running process listens
// (Listen) and, when a taker comes, stops reading, builds its snapshot and
// sends it with its descriptors (Offer.Send); it stops only once the taker
// confirms (Offer.Wait), and serves on if the taker fails or goes away. A
// new process dials (Dial): nobody listening means a clean start; a
// refusal (another taker first, a format it does not read) is an error
// that names the reason.
//
// What it owns: the socket's protocol (conn_linux.go) and the snapshot's
// container (snapshot.go): a header with the format version and a CRC-32C
// of the body, then sections each owner encodes and decodes with Enc and
// Dec. It knows nothing of flows or tables, and imports nothing of ours.
// Every byte it reads is bounded and checked: the snapshot's decoder is
// fuzzed (FuzzSnapshot), since a snapshot may come from another build.
package handover
