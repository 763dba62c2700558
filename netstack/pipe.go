package netstack

import (
	"context"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// asyncPipe connects two stacks through queues, like a veth pair: a packet
// written on one side is delivered to the other by a pump goroutine, never
// inline. (gVisor's link/pipe delivers inline, on the writer's goroutine,
// which can re-enter a TCP endpoint that holds its lock.)
type asyncPipe struct {
	a, b   *channel.Endpoint
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newAsyncPipe(mtu uint32, queue int) *asyncPipe {
	ctx, cancel := context.WithCancel(context.Background())
	p := &asyncPipe{a: channel.New(queue, mtu, ""), b: channel.New(queue, mtu, ""), cancel: cancel}
	p.wg.Add(2)
	go p.pumpAToB(ctx)
	go p.pumpBToA(ctx)
	return p
}

func (p *asyncPipe) pumpAToB(ctx context.Context) { // pipe pump: proxy stack -> client stack
	defer p.wg.Done()
	pump(ctx, p.a, p.b)
}

func (p *asyncPipe) pumpBToA(ctx context.Context) { // pipe pump: client stack -> proxy stack
	defer p.wg.Done()
	pump(ctx, p.b, p.a)
}

// pump moves what from's stack writes to to's stack, as fresh packets
// without header metadata.
func pump(ctx context.Context, from, to *channel.Endpoint) {
	for {
		pkt := from.ReadContext(ctx)
		if pkt == nil {
			return
		}
		fresh := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: pkt.ToBuffer()})
		to.InjectInbound(pkt.NetworkProtocolNumber, fresh)
		fresh.DecRef()
		pkt.DecRef()
	}
}

// close stops the pumps and drops queued packets.
func (p *asyncPipe) close() {
	p.cancel()
	p.wg.Wait()
	p.a.Close()
	p.b.Close()
}
