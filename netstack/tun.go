package netstack

// TUNOptions says how to open a TUN device.
type TUNOptions struct {
	// Name is the device name (on Linux, an existing persistent device
	// owned by the calling user is opened without privileges). On macOS the
	// system picks a utun name and Name is ignored.
	Name string
	// MTU of the device; 0 means DefaultMTU. It must match the device's.
	MTU uint32
	// Queues is the number of queues to open (Linux multi-queue TUN); each
	// gets its own dispatcher goroutine. 0 means 1.
	Queues int
	// MultiQueue opens the device as a multi-queue one even with one
	// queue: a multi-queue device exists (the kernel refuses to open it
	// otherwise, and a device made multi-queue stays so).
	MultiQueue bool
	// Persistent keeps (or makes) the device persistent: it outlives the
	// process (Linux). Opening a persistent device made by `userproxy
	// setup` must set it, or the device would vanish when the proxy exits.
	Persistent bool
	// NoOffload opens a Linux device without virtio-net headers and TCP
	// offloads (tunlink_linux.go): every packet is cut to the MTU and
	// checksummed by the kernel and by the gate, as before they existed.
	NoOffload bool
	// Portable opens the device the way every platform can: water's TUN
	// and the generic device link (NewDeviceLink), one packet per read and
	// write, no offloads, one queue. It is the only way off Linux (macOS's
	// utun); on Linux it runs the macOS path's code against a real device,
	// so that only utun's own specifics go untested there.
	Portable bool
}
