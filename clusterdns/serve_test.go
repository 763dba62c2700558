package clusterdns_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/miekg/dns"

	"github.com/userproxy/userproxy/clusterdns"
)

// udpFlow runs ServeUDP on a socket connected to a client socket, both on
// 127.0.0.1, as the proxy hands the responder one connected flow. The
// client writes to the returned address.
func udpFlow(t *testing.T, r *clusterdns.Responder) (client *net.UDPConn, server *net.UDPAddr, done <-chan struct{}) {
	t.Helper()
	client, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}, client.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	go func() { // the flow's handler
		defer close(ch)
		r.ServeUDP(conn)
	}()
	t.Cleanup(func() {
		conn.Close()
		client.Close()
		<-ch
	})
	return client, conn.LocalAddr().(*net.UDPAddr), ch
}

func udpAsk(t *testing.T, c *net.UDPConn, to *net.UDPAddr, m *dns.Msg) (*dns.Msg, int) {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDP(b, to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := c.ReadFromUDP(buf)
	if err != nil {
		t.Fatal(err)
	}
	reply := new(dns.Msg)
	if err := reply.Unpack(buf[:n]); err != nil {
		t.Fatalf("reply does not unpack: %v", err)
	}
	return reply, n
}

// tcpServer accepts connections on 127.0.0.1 and runs ServeTCP on each.
func tcpServer(t *testing.T, r *clusterdns.Responder) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() { // accept loop
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { // one connection's handler
				defer c.Close()
				r.ServeTCP(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// Over UDP, a reply larger than 512 bytes (no EDNS0) or than the client's
// EDNS0 size is truncated with TC; the same query over TCP gets it whole.
func TestTruncation(t *testing.T) {
	r := newResponder(t, newTracker(t, fixture()...))
	client, server, _ := udpFlow(t, r)
	const name = "many.acc.svc.cluster.local."

	small, n := udpAsk(t, client, server, query(name, dns.TypeA))
	if !small.Truncated || n > 512 || len(small.Answer) >= 60 {
		t.Fatalf("without EDNS0: TC %v, %d bytes, %d answers; want TC, at most 512 bytes", small.Truncated, n, len(small.Answer))
	}
	big := query(name, dns.TypeA)
	big.SetEdns0(4096, false)
	whole, n := udpAsk(t, client, server, big)
	if whole.Truncated || len(whole.Answer) != 60 {
		t.Fatalf("with EDNS0 4096: TC %v, %d bytes, %d answers; want all 60", whole.Truncated, n, len(whole.Answer))
	}
	mid := query(name, dns.TypeA)
	mid.SetEdns0(700, false)
	if reply, n := udpAsk(t, client, server, mid); !reply.Truncated || n > 700 || reply.IsEdns0() == nil {
		t.Fatalf("with EDNS0 700: TC %v, %d bytes, OPT %v", reply.Truncated, n, reply.IsEdns0() != nil)
	}

	// Then TCP, as the client does after TC.
	c := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
	reply, _, err := c.Exchange(query(name, dns.TypeA), tcpServer(t, r))
	if err != nil {
		t.Fatal(err)
	}
	if reply.Truncated || len(reply.Answer) != 60 {
		t.Fatalf("over TCP: TC %v, %d answers", reply.Truncated, len(reply.Answer))
	}
	if got := r.Stats().Truncated; got != 2 {
		t.Errorf("Stats.Truncated = %d, want 2", got)
	}
}

// A reply that fits only without its additional section loses it, without
// the TC bit: only the answer is required.
func TestTruncationDropsAdditionalFirst(t *testing.T) {
	objs := fixture()
	// SRV targets are never compressed (RFC 2782): 8 of them fit 512
	// bytes, not with their 8 A records.
	eps := make([]string, 8)
	for i := range eps {
		eps[i] = net.IPv4(10, 2, 0, byte(i+1)).String()
	}
	objs = append(objs, svcObj("acc/srv", "None", "", "http/TCP/80"), sliceObj("acc/srv-a", "srv", tcpPort("http", 80), eps...))
	r := newResponder(t, newTracker(t, objs...))
	q := query("_http._tcp.srv.acc.svc.cluster.local.", dns.TypeSRV)
	full := r.Answer(q, clusterdns.UDP)
	full.Compress = true
	if full.Len() <= 512 || len(full.Extra) != 8 {
		t.Fatalf("the fixture must be over 512 bytes with its additional records: %d bytes, %d extra", full.Len(), len(full.Extra))
	}
	full.Extra = nil
	if full.Len() > 512 {
		t.Fatalf("the fixture must fit 512 bytes without its additional records: %d", full.Len())
	}
	client, server, _ := udpFlow(t, r)
	reply, _ := udpAsk(t, client, server, q)
	if reply.Truncated || len(reply.Answer) != 8 || len(reply.Extra) != 0 {
		t.Fatalf("TC %v, %d answers, %d extra; want 8 answers, no extra, no TC", reply.Truncated, len(reply.Answer), len(reply.Extra))
	}
}

// ServeTCP: several queries on one connection, FORMERR for a garbled
// message with a readable header, and the end of the connection at a
// frame too short to be a message.
func TestServeTCP(t *testing.T) {
	r := newResponder(t, newTracker(t, fixture()...))
	conn, err := net.Dial("tcp", tcpServer(t, r))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	dc := &dns.Conn{Conn: conn}
	for i, name := range []string{"web.acc.svc.cluster.local.", "dual.acc.svc.cluster.local.", "nope.acc.svc.cluster.local."} {
		if err := dc.WriteMsg(query(name, dns.TypeA)); err != nil {
			t.Fatal(err)
		}
		reply, err := dc.ReadMsg()
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		want := []string{"NOERROR", "NOERROR", "NXDOMAIN"}[i]
		if got := clusterdns.RcodeString(reply.Rcode); got != want {
			t.Errorf("query %d (%s): %s, want %s", i, name, got, want)
		}
	}
	// A header claiming a question that is not there.
	garbled := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'w'}
	frame := binary.BigEndian.AppendUint16(nil, uint16(len(garbled)))
	if _, err := conn.Write(append(frame, garbled...)); err != nil {
		t.Fatal(err)
	}
	reply, err := dc.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	if reply.Id != 0x1234 || reply.Rcode != dns.RcodeFormatError || !reply.Response {
		t.Fatalf("garbled query: ID %#x rcode %s", reply.Id, clusterdns.RcodeString(reply.Rcode))
	}
	// A 3-byte frame: the server closes the connection (a FIN, or a RST
	// for the bytes it left unread), well before the idle timeout.
	if _, err := conn.Write([]byte{0, 3, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("after a short frame the connection stayed open: %v", err)
	}
}

// A UDP flow ends after UDPIdle without a query; garbage is answered
// FORMERR or not at all, and the flow goes on.
func TestServeUDP(t *testing.T) {
	r := newResponder(t, newTracker(t, fixture()...), func(c *clusterdns.Config) { c.UDPIdle = 200 * time.Millisecond })
	client, server, done := udpFlow(t, r)
	// Too short for a header, and a response: no answer.
	for _, junk := range [][]byte{{1, 2, 3}, {0, 1, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0}} {
		if _, err := client.WriteToUDP(junk, server); err != nil {
			t.Fatal(err)
		}
	}
	// A readable header with a broken question: FORMERR.
	if _, err := client.WriteToUDP([]byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0}, server); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := client.ReadFromUDP(buf)
	if err != nil {
		t.Fatal(err)
	}
	var m dns.Msg
	if err := m.Unpack(buf[:n]); err != nil || m.Id != 0xabcd || m.Rcode != dns.RcodeFormatError {
		t.Fatalf("reply to a broken question: %v %v", m.MsgHdr, err)
	}
	reply, _ := udpAsk(t, client, server, query("web.acc.svc.cluster.local.", dns.TypeA))
	if len(reply.Answer) != 1 {
		t.Fatalf("a query after the junk: %v", reply)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeUDP did not return after its idle timeout")
	}
	if s := r.Stats(); s.Dropped != 2 {
		t.Errorf("Stats.Dropped = %d, want 2", s.Dropped)
	}
}

// Names outside the domain go to the upstream server when there is one:
// over UDP, again over TCP when the answer is truncated, SERVFAIL when the
// server does not answer in time.
func TestForward(t *testing.T) {
	var mux dns.ServeMux
	mux.HandleFunc("example.com.", func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		m.RecursionAvailable = true
		for i := range 40 {
			rr, _ := dns.NewRR(fmt.Sprintf("example.com. 60 IN A 192.0.2.%d", i))
			if req.Question[0].Name == "big.example.com." || i == 0 {
				m.Answer = append(m.Answer, rr)
			}
		}
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp && len(m.Answer) > 1 {
			m.Answer, m.Truncated = nil, true
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	servers := []*dns.Server{{PacketConn: pc, Handler: &mux}, {Listener: ln, Handler: &mux}}
	var wg sync.WaitGroup
	for _, s := range servers {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() { _ = s.ActivateAndServe() }) // the test's upstream server
		<-started
	}
	t.Cleanup(func() {
		for _, s := range servers {
			_ = s.Shutdown()
		}
		wg.Wait()
	})

	// A closed port for the failure case.
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.LocalAddr().String()
	dead.Close()

	tr := newTracker(t, fixture()...)
	up := newResponder(t, tr, func(c *clusterdns.Config) { c.Upstream = pc.LocalAddr().String() })
	down := newResponder(t, tr, func(c *clusterdns.Config) {
		c.Upstream, c.UpstreamTimeout = deadAddr, 300*time.Millisecond
	})
	cases := []struct {
		name string
		r    *clusterdns.Responder
		q    *dns.Msg
		want view
	}{
		{"forwarded", up, query("example.com.", dns.TypeA), view{Rcode: "NOERROR", RA: true,
			Answer: []string{"example.com. 60 IN A 192.0.2.0"}, QuestionName: "example.com."}},
		{"truncated upstream: again over TCP", up, query("big.example.com.", dns.TypeA), view{Rcode: "NOERROR", RA: true,
			QuestionName: "big.example.com."}},
		{"cluster names are never forwarded", up, query("nope.acc.svc.cluster.local.", dns.TypeA), view{Rcode: "NXDOMAIN", AA: true, RA: true,
			Ns: []string{soa}, QuestionName: "nope.acc.svc.cluster.local."}},
		{"service CIDR PTRs are never forwarded", up, query("9.9.96.10.in-addr.arpa.", dns.TypePTR), view{Rcode: "NXDOMAIN", AA: true, RA: true,
			Ns: []string{reverseSOA}, QuestionName: "9.9.96.10.in-addr.arpa."}},
		{"upstream silent: SERVFAIL", down, query("example.com.", dns.TypeA), view{Rcode: "SERVFAIL", RA: true, QuestionName: "example.com."}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.q.Id = 4242
			reply := c.r.Answer(c.q, clusterdns.UDP)
			got := viewOf(reply)
			if c.name == "truncated upstream: again over TCP" {
				if len(got.Answer) != 40 || got.TC {
					t.Fatalf("%d answers, TC %v; want the 40 of the TCP answer", len(got.Answer), got.TC)
				}
				got.Answer = nil
			}
			if diff := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if reply.Id != 4242 {
				t.Errorf("reply ID %d, want the query's", reply.Id)
			}
		})
	}
	if s := down.Stats(); s.Forwarded != 1 || s.UpstreamErrors != 1 {
		t.Errorf("down: Forwarded %d, UpstreamErrors %d; want 1, 1", s.Forwarded, s.UpstreamErrors)
	}
	if s := up.Stats(); s.Forwarded != 2 || s.UpstreamErrors != 0 {
		t.Errorf("up: Forwarded %d, UpstreamErrors %d; want 2, 0", s.Forwarded, s.UpstreamErrors)
	}
}
