package netstack

import (
	"errors"
	"fmt"

	"github.com/songgao/water"
)

// OpenTUN opens the TUN device opts.Name, one descriptor per queue, and
// drives it with the endpoint of tunlink_linux.go: a reader goroutine per
// queue that delivers each packet itself, one writev per packet out.
//
// The device is opened with virtio-net headers and TCP offloads unless
// opts.NoOffload is set; a kernel or device that refuses them gets the plain
// mode, and Link.Offload says which it is.
//
// gVisor trusts the checksums of inbound packets (RXChecksumOffload): the gate
// has verified them already, since conntrack drops every TCP, UDP and ICMP
// packet with a bad checksum as INVALID and every other packet is dropped
// too, or the kernel has vouched for them in the packet's virtio-net header.
func OpenTUN(opts TUNOptions) (*Link, error) {
	if opts.Portable {
		return openPortableTUN(opts)
	}
	if opts.MTU == 0 {
		opts.MTU = DefaultMTU
	}
	if opts.Queues <= 0 {
		opts.Queues = 1
	}
	queues, name, err := openTUNQueues(opts, !opts.NoOffload)
	var offloadErr error
	if err != nil && !opts.NoOffload {
		offloadErr = err
		queues, name, err = openTUNQueues(opts, false)
	}
	if err != nil {
		return nil, err
	}
	l := tunLink(newTUNEndpoint(queues, opts.MTU, offloadErr == nil && !opts.NoOffload), name)
	if offloadErr != nil {
		l.OffloadRefused = offloadErr
	}
	return l, nil
}

// tunLink is the Link of a TUN endpoint of device name; closing it closes
// the queues.
func tunLink(ep *tunEndpoint, name string) *Link {
	closeAll := func() error {
		ep.closed.Store(true)
		ep.stopReaders()
		var errs []error
		for _, q := range ep.queues {
			errs = append(errs, q.f.Close())
		}
		return errors.Join(errs...)
	}
	l := &Link{ep: ep, name: name, close: closeAll, unsupported: &ep.unsupported, reads: ep.reads,
		stopReads: func() { ep.stopReaders(); ep.readers.Wait() }}
	l.Offload = ep.vnet
	return l
}

// openTUNQueues opens opts.Queues queues of the device, closing them all if
// one fails.
func openTUNQueues(opts TUNOptions, vnet bool) ([]tunQueue, string, error) {
	var queues []tunQueue
	name := opts.Name
	for range opts.Queues {
		q, got, err := openTUNQueue(name, opts.Queues > 1 || opts.MultiQueue, opts.Persistent, vnet)
		if err != nil {
			for _, q := range queues {
				_ = q.f.Close()
			}
			return nil, "", fmt.Errorf("opening TUN device %q: %w", opts.Name, err)
		}
		queues = append(queues, q)
		name = got
	}
	return queues, name, nil
}

// portableConfig is water's configuration for the portable path on Linux:
// the device by its name, kept persistent if it is (water sets the flag on
// every open).
func portableConfig(opts TUNOptions) water.Config {
	c := water.Config{DeviceType: water.TUN}
	c.Name, c.Persist, c.MultiQueue = opts.Name, opts.Persistent, opts.MultiQueue
	return c
}
