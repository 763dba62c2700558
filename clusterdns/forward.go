package clusterdns

import (
	"context"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/zap"
)

// upstream is the server names outside the cluster domain go to.
type upstream struct {
	addr    string
	timeout time.Duration
}

// forward asks the upstream server and returns its answer under the
// client's ID: over the client's transport, and over TCP again when a UDP
// answer comes back truncated. No answer in time: SERVFAIL (reply).
func (r *Responder) forward(req, reply *dns.Msg, tr Transport) *dns.Msg {
	r.stats.forwarded.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), r.upstream.timeout)
	defer cancel()
	q := req.Copy()
	network := "udp"
	if tr == TCP {
		network = "tcp"
	}
	c := &dns.Client{Net: network, Timeout: r.upstream.timeout}
	resp, _, err := c.ExchangeContext(ctx, q, r.upstream.addr)
	if err == nil && resp.Truncated && network == "udp" {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, q, r.upstream.addr)
	}
	if err != nil || resp == nil {
		r.stats.upstream.Add(1)
		if ce := r.logger.Check(zap.DebugLevel, "dns upstream failed"); ce != nil {
			ce.Write(zap.String("upstream", r.upstream.addr), zap.Error(err))
		}
		reply.Rcode = dns.RcodeServerFailure
		return reply
	}
	resp.Id = req.Id
	return resp
}
