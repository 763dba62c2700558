package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/user"
	"strconv"

	"github.com/songgao/water"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/netstack"
)

// tunDevice is the TUN the proxy reads, and what run created so that it can
// remove exactly that on exit.
type tunDevice struct {
	link    *netstack.Link
	name    string
	routes  []netlink.Route // routes run added (removed on exit)
	created bool            // run created the device (it goes when closed)
	// handedOver: the device and its routes are the next process's
	// (handover_linux.go); nothing of them is removed here.
	handedOver bool
	// inherited are the routes the process taken over from added: this
	// one's to remove once that process has committed (commit).
	inherited []netlink.Route
	logger    *zap.Logger
	// The portable path (--tun-portable): routes by ip(8) commands, as
	// macOS's by route(8), and those run added.
	cmds      routeCommands
	cmdRoutes []netip.Prefix
}

// openTUN opens the TUN device c.name, creating it when missing (root), and
// adds the routes of cidrs that are missing. A persistent device made by
// `userproxy setup` is opened as is, without privileges; one made without
// multi-queue (by an older setup, or another tool) is opened with one queue.
func openTUN(c tunConfig, cidrs []netip.Prefix, logger *zap.Logger) (*tunDevice, error) {
	name, mtu, queues := c.name, c.mtu, max(c.queues, 1)
	d := &tunDevice{name: name, logger: logger}
	if c.portable {
		queues = 1 // water opens one
		d.cmds = ipRoute{}
	}
	multiQueue := queues > 1 // as the device is, when it exists
	existing, err := netlink.LinkByName(name)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return nil, fmt.Errorf("looking up device %q: %w", name, err)
		}
		existing = nil
	}
	if existing != nil {
		if !isTUN(existing) {
			return nil, fmt.Errorf("device %q exists and is a %s, not a TUN device", name, existing.Type())
		}
		mtu = existing.Attrs().MTU
		t := existing.(*netlink.Tuntap)
		// A multi-queue device takes more queues while another process
		// reads it, and the kernel would move some of that process's flows
		// onto ours: refused, as a single-queue device refuses a second
		// open (EBUSY in tun_attach).
		if t.Queues > 0 {
			return nil, tunHint(name, false, fmt.Errorf("%d queue(s) attached: %w", t.Queues, unix.EBUSY))
		}
		multiQueue = t.Flags&netlink.TUNTAP_MULTI_QUEUE != 0
		if !multiQueue && queues > 1 {
			logger.Info("the device is single-queue: one reader (`userproxy setup` makes multi-queue devices)", zap.String("device", name))
			queues = 1
		}
	} else {
		d.created = true
	}
	// A device that exists stays as persistent as it was (water sets the
	// flag on every open).
	persistent := existing != nil && isPersistent(existing)
	d.link, err = netstack.OpenTUN(netstack.TUNOptions{Name: name, MTU: uint32(mtu), Queues: queues, MultiQueue: multiQueue, Persistent: persistent, NoOffload: !c.offload, Portable: c.portable})
	if err != nil {
		return nil, tunHint(name, existing == nil, err)
	}
	// The check above and the open are two steps: two runs starting at
	// once (or creating the device at once) could both pass it and share
	// the device. Counted again now, the queues must be ours alone; each
	// racer sees the other's and refuses.
	if multiQueue {
		if l, err := netlink.LinkByName(name); err == nil {
			if t, ok := l.(*netlink.Tuntap); ok && t.Queues > queues {
				_ = d.link.Close()
				return nil, tunHint(name, false, fmt.Errorf("%d queue(s) attached besides our %d: %w", t.Queues-queues, queues, unix.EBUSY))
			}
		}
	}
	if d.link.OffloadRefused != nil {
		logger.Warn("the TUN refused virtio-net headers or TCP offloads; every packet is cut to the MTU", zap.String("device", name), zap.Error(d.link.OffloadRefused))
	}
	logger.Info("TUN device open", zap.String("device", name), zap.Bool("offload", d.link.Offload), zap.Int("queues", queues))
	if d.created {
		if err := configureNewTUN(name, mtu, logger); err != nil {
			d.close()
			return nil, err
		}
	}
	if err := d.addRoutes(cidrs); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// configureNewTUN prepares a device run or setup just created: IPv6 without
// duplicate address detection or a link-local address (the kernel would hold
// IPv6 output until DAD finished), the MTU, and up. In a container whose
// /proc/sys is read-only (every runtime's default for an unprivileged one)
// the IPv6 settings cannot be made: that is logged, and IPv6 traffic into
// the device may wait the second or so DAD takes at start.
func configureNewTUN(name string, mtu int, logger *zap.Logger) error {
	for _, kv := range [][2]string{{"addr_gen_mode", "1"}, {"accept_dad", "0"}} {
		p := "/proc/sys/net/ipv6/conf/" + name + "/" + kv[0]
		err := os.WriteFile(p, []byte(kv[1]), 0o644)
		switch {
		case err == nil, errors.Is(err, os.ErrNotExist):
		case errors.Is(err, unix.EROFS), errors.Is(err, os.ErrPermission):
			logger.Warn("cannot turn off IPv6 address generation and DAD on the new device (read-only /proc/sys); IPv6 may wait for DAD at start",
				zap.String("dev", name), zap.String("path", p), zap.Error(err))
		default:
			return fmt.Errorf("device %q: writing %s: %w", name, p, err)
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("device %q: %w", name, err)
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("device %q: setting MTU %d: %w", name, mtu, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("device %q: setting it up: %w", name, err)
	}
	return nil
}

// addRoutes routes each CIDR into the device unless such a route exists
// (as after `userproxy setup`, when run has no privilege to add one).
func (d *tunDevice) addRoutes(cidrs []netip.Prefix) error {
	if d.cmds != nil {
		for _, p := range cidrs {
			switch err := d.cmds.add(p, d.name); {
			case errors.Is(err, errRouteExists):
			case err != nil:
				return err
			default:
				d.cmdRoutes = append(d.cmdRoutes, p)
				d.logger.Info("route added", zap.Stringer("cidr", p), zap.String("dev", d.name), zap.String("by", "ip route"))
			}
		}
		return nil
	}
	l, err := netlink.LinkByName(d.name)
	if err != nil {
		return fmt.Errorf("device %q: %w", d.name, err)
	}
	have := map[string]bool{}
	existing, err := netlink.RouteList(l, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the routes of %q: %w", d.name, err)
	}
	for _, r := range existing {
		if r.Dst != nil {
			have[r.Dst.String()] = true
		}
	}
	for _, p := range cidrs {
		dst := prefixNet(p)
		if have[dst.String()] {
			continue
		}
		r := netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}
		if err := netlink.RouteAdd(&r); err != nil {
			if errors.Is(err, unix.EEXIST) {
				continue
			}
			if errors.Is(err, unix.EPERM) {
				return fmt.Errorf("adding route %s dev %s: %w (run as root, or add it with `sudo userproxy setup --service-cidr %s ...`)", p, d.name, err, p)
			}
			return fmt.Errorf("adding route %s dev %s: %w", p, d.name, err)
		}
		d.routes = append(d.routes, r)
		d.logger.Info("route added", zap.Stringer("cidr", p), zap.String("dev", d.name))
	}
	return nil
}

// close removes the routes run added and closes the device (a device run
// created disappears with its last descriptor, and its routes with it).
func (d *tunDevice) close() {
	for _, p := range d.cmdRoutes {
		if err := d.cmds.del(p, d.name); err != nil {
			d.logger.Warn("removing route", zap.Stringer("cidr", p), zap.Error(err))
		}
	}
	d.cmdRoutes = nil
	for i := range d.routes {
		if err := netlink.RouteDel(&d.routes[i]); err != nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, unix.ENODEV) {
			d.logger.Warn("removing route", zap.Stringer("cidr", d.routes[i].Dst), zap.Error(err))
		}
	}
	d.routes = nil
}

// grantTUNAccess makes /dev/net/tun usable by unprivileged users (mode
// 0666, the usual distribution default, which opening a device owned by
// the user also needs); it says so when it changes anything.
func grantTUNAccess(logger *zap.Logger) error {
	const dev = "/dev/net/tun"
	fi, err := os.Stat(dev)
	if err != nil {
		return fmt.Errorf("%s: %w", dev, err)
	}
	if fi.Mode().Perm()&0o006 == 0o006 {
		return nil
	}
	if err := os.Chmod(dev, fi.Mode().Perm()|0o666); err != nil {
		return fmt.Errorf("making %s usable by users: %w", dev, err)
	}
	logger.Warn("made /dev/net/tun readable and writable by all users (mode 0666, the usual default); unprivileged users can open only TUN devices they own",
		zap.String("previousMode", fi.Mode().Perm().String()))
	return nil
}

// isPersistent reports whether a TUN device outlives its descriptors.
func isPersistent(l netlink.Link) bool {
	t, ok := l.(*netlink.Tuntap)
	return ok && !t.NonPersist
}

// isTUN reports whether l is a TUN (not TAP) device.
func isTUN(l netlink.Link) bool {
	t, ok := l.(*netlink.Tuntap)
	return ok && t.Mode == netlink.TUNTAP_MODE_TUN
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// prefixOf is prefixNet's inverse.
func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	if !ok {
		return netip.Prefix{}, false
	}
	if len(n.Mask) == net.IPv4len {
		a = a.Unmap()
	}
	return netip.PrefixFrom(a, ones), true
}

// setupTUN creates (or, with remove, deletes) the persistent TUN device for
// an unprivileged user: owned by the user, configured, up, with the routes.
func setupTUN(name, userName string, mtu int, cidrs []netip.Prefix, remove bool, logger *zap.Logger) error {
	if remove {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("device %q: %w", name, err)
		}
		if !isTUN(l) {
			return fmt.Errorf("device %q is a %s, not a TUN device; not removing it", name, l.Type())
		}
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("removing device %q: %w", name, err)
		}
		logger.Info("device removed", zap.String("dev", name))
		return nil
	}
	u, err := user.Lookup(userName)
	if err != nil {
		return fmt.Errorf("--user %q: %w", userName, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return fmt.Errorf("--user %q: uid %q: %w", userName, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return fmt.Errorf("--user %q: gid %q: %w", userName, u.Gid, err)
	}
	if _, err := netlink.LinkByName(name); err == nil {
		return fmt.Errorf("device %q already exists (remove it with `userproxy setup --remove --tun-name %s`)", name, name)
	}
	if err := grantTUNAccess(logger); err != nil {
		return err
	}
	cfg := water.Config{DeviceType: water.TUN}
	cfg.Name = name
	cfg.Persist = true
	cfg.Permissions = &water.DevicePermissions{Owner: uint(uid), Group: uint(gid)}
	cfg.MultiQueue = true // run opens a queue per CPU (--tun-queues)
	ifce, err := water.New(cfg)
	if err != nil {
		return fmt.Errorf("creating persistent TUN device %q: %w", name, err)
	}
	if err := ifce.Close(); err != nil {
		return fmt.Errorf("device %q: %w", name, err)
	}
	if err := configureNewTUN(name, mtu, logger); err != nil {
		return err
	}
	d := &tunDevice{name: name, logger: logger}
	if err := d.addRoutes(cidrs); err != nil {
		return err
	}
	logger.Info("persistent TUN device ready", zap.String("dev", name), zap.String("owner", userName), zap.Int("mtu", mtu))
	return nil
}

// netlinkRoutes adds and removes host routes into the device (routeOps).
type netlinkRoutes struct{ index int }

// hostRoutes returns the device's routeOps for external addresses.
func (d *tunDevice) hostRoutes() (routeOps, error) {
	if d.cmds != nil {
		return routeCmds{dev: d.name, cmds: d.cmds}, nil
	}
	l, err := netlink.LinkByName(d.name)
	if err != nil {
		return nil, fmt.Errorf("device %q: %w", d.name, err)
	}
	return netlinkRoutes{index: l.Attrs().Index}, nil
}

func (n netlinkRoutes) add(dst netip.Prefix) error {
	err := netlink.RouteAdd(&netlink.Route{LinkIndex: n.index, Dst: prefixNet(dst)})
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	// Someone's route: fine if it leads into the TUN, else traffic to the
	// address goes elsewhere and must be reported.
	family := netlink.FAMILY_V4
	if dst.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	routes, lerr := netlink.RouteListFiltered(family, &netlink.Route{Dst: prefixNet(dst)}, netlink.RT_FILTER_DST)
	if lerr != nil {
		return fmt.Errorf("a route to %s exists; listing it: %w", dst, lerr)
	}
	for _, r := range routes {
		if r.LinkIndex == n.index {
			return errRouteExists
		}
	}
	return fmt.Errorf("a route to %s exists through another device", dst)
}

func (n netlinkRoutes) del(dst netip.Prefix) error {
	err := netlink.RouteDel(&netlink.Route{LinkIndex: n.index, Dst: prefixNet(dst)})
	if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}

// primaryAddrs returns the node's primary address of each family: the
// preferred source of its default route, else the first global address of
// the default route's device (kube-proxy's "primary" NodePort addresses).
func primaryAddrs() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteList(nil, fam)
		if err != nil {
			return nil, fmt.Errorf("listing routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
				continue // not a default route
			}
			if a, ok := netip.AddrFromSlice(r.Src); ok && r.Src != nil {
				out = append(out, a.Unmap())
				break
			}
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			addrs, err := netlink.AddrList(l, fam)
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsGlobalUnicast() {
					out = append(out, ip.Unmap())
					break
				}
			}
			break
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no default route: this host has no primary address")
	}
	return out, nil
}
