package clusterdns

// One client flow, from bytes to bytes:
//
//  1. read a message: one datagram (UDP), or a 2-byte length and that many
//     bytes (TCP); each read is bounded by the idle timeout, which ends the
//     flow.
//  2. Respond: unpack; a message that does not unpack gets FORMERR when its
//     header is readable (and it is not a response), nothing otherwise;
//     else Answer.
//  3. fit the reply: over UDP into 512 bytes or the client's EDNS0 size
//     (at most 4096): first without the additional section, else truncated
//     with the TC bit set; over TCP into 65535 bytes.
//  4. write it (with its length prefix over TCP) and read the next.

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"github.com/miekg/dns"
	"go.uber.org/zap"
)

// maxUDPSize caps the EDNS0 size a client may ask for.
const maxUDPSize = 4096

// headerLen is the size of a DNS header.
const headerLen = 12

var msgPool = sync.Pool{New: func() any { b := make([]byte, dns.MaxMsgSize+2); return &b }}

// ServeUDP answers the queries of one UDP flow: conn reads the client's
// datagrams and writes to the client. It returns when conn fails or no
// query came for Config.UDPIdle; the caller closes conn. It implements
// proxy.LocalHandler.
func (r *Responder) ServeUDP(conn net.Conn) {
	bp := msgPool.Get().(*[]byte)
	defer msgPool.Put(bp)
	buf := *bp
	for {
		_ = conn.SetReadDeadline(r.cfg.Now().Add(r.cfg.UDPIdle)) // 1
		n, err := conn.Read(buf)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue // an ICMP error from the client's side
			}
			return
		}
		out := r.Respond(buf[:n], UDP, conn.RemoteAddr()) // 2, 3
		if out == nil {
			continue
		}
		if _, err := conn.Write(out); err != nil && !errors.Is(err, syscall.ECONNREFUSED) { // 4
			return
		}
	}
}

// ServeTCP answers the queries of one TCP connection, in order, until the
// client closes it, a message is malformed in its framing, or no query
// came for Config.TCPIdle; the caller closes conn. It implements
// proxy.LocalHandler.
func (r *Responder) ServeTCP(conn net.Conn) {
	bp := msgPool.Get().(*[]byte)
	defer msgPool.Put(bp)
	buf := *bp
	for {
		_ = conn.SetReadDeadline(r.cfg.Now().Add(r.cfg.TCPIdle)) // 1
		if _, err := io.ReadFull(conn, buf[:2]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(buf[:2]))
		if n < headerLen {
			return // not a message: the framing is lost
		}
		if _, err := io.ReadFull(conn, buf[2:2+n]); err != nil {
			return
		}
		out := r.Respond(buf[2:2+n], TCP, conn.RemoteAddr()) // 2, 3
		if out == nil {
			continue
		}
		frame := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(frame, uint16(len(out)))
		copy(frame[2:], out)
		_ = conn.SetWriteDeadline(r.cfg.Now().Add(r.cfg.TCPIdle))
		if _, err := conn.Write(frame); err != nil { // 4
			return
		}
	}
}

// Respond answers one message in wire format received over tr from client
// (nil when unknown; for the log only), and returns the reply in wire
// format, fitted to the transport, or nil for no reply (steps 2, 3).
func (r *Responder) Respond(msg []byte, tr Transport, client net.Addr) []byte {
	start := r.cfg.Now()
	req := new(dns.Msg)
	if err := req.Unpack(msg); err != nil {
		out := r.formErr(msg)
		if ce := r.logger.Check(zap.DebugLevel, "dns query"); ce != nil {
			ce.Write(zap.Stringer("transport", tr), clientField(client), zap.String("rcode", "FORMERR"),
				zap.Bool("answered", out != nil), zap.Error(err))
		}
		return out
	}
	reply := r.Answer(req, tr)
	if reply == nil {
		return nil
	}
	r.fit(reply, req, tr)
	out, err := reply.Pack()
	if err != nil {
		// Cannot happen for replies Answer builds; never leave the client
		// without an answer all the same.
		fail := new(dns.Msg)
		fail.SetRcode(req, dns.RcodeServerFailure)
		fail.Question = nil
		out, _ = fail.Pack()
	}
	if ce := r.logger.Check(zap.DebugLevel, "dns query"); ce != nil {
		fields := []zap.Field{zap.Stringer("transport", tr), clientField(client),
			zap.String("rcode", RcodeString(reply.Rcode)), zap.Int("answers", len(reply.Answer)),
			zap.Bool("truncated", reply.Truncated), zap.Duration("took", r.cfg.Now().Sub(start))}
		if len(req.Question) > 0 {
			fields = append(fields, zap.String("name", req.Question[0].Name), zap.String("type", dns.TypeToString[req.Question[0].Qtype]))
		}
		ce.Write(fields...)
	}
	return out
}

func clientField(a net.Addr) zap.Field {
	if a == nil {
		return zap.Skip()
	}
	return zap.Stringer("client", a)
}

// formErr answers a message that does not unpack: FORMERR with its ID and
// opcode when it has a header and is a query, else nothing.
func (r *Responder) formErr(msg []byte) []byte {
	if len(msg) < headerLen || msg[2]&0x80 != 0 {
		r.stats.dropped.Add(1)
		return nil
	}
	reply := &dns.Msg{MsgHdr: dns.MsgHdr{
		Id:               binary.BigEndian.Uint16(msg),
		Response:         true,
		Opcode:           int(msg[2]>>3) & 0xf,
		RecursionDesired: msg[2]&1 != 0,
		Rcode:            dns.RcodeFormatError,
	}}
	r.stats.count(nil, dns.RcodeFormatError)
	out, err := reply.Pack()
	if err != nil {
		return nil
	}
	return out
}

// fit makes reply fit the transport (step 3). A reply that fits only
// without its additional records loses them without the TC bit (they are
// not required, RFC 2181 9).
func (r *Responder) fit(reply, req *dns.Msg, tr Transport) {
	size := dns.MaxMsgSize
	if tr == UDP {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPSize)
		}
	}
	reply.Compress = true
	if reply.Len() <= size {
		return
	}
	extra := reply.Extra
	reply.Extra = onlyOPT(extra)
	if reply.Len() <= size {
		return
	}
	reply.Extra = extra
	reply.Truncate(size)
	if reply.Truncated && tr == UDP {
		r.stats.truncated.Add(1)
	}
}
