package admin

// /debug/ipvs: the service table as `ipvsadm -Ln` would list it on a node
// running kube-proxy in IPVS mode.
//
//  1. the query picks the columns: stats (ipvsadm --stats) or rate
//     (--rate), each "1", "true" or empty to turn it on;
//  2. Config.IPVS gives proxy's snapshot, which ipvsOf turns into the
//     plain values of package rules;
//  3. rules.WriteIPVS prints it.

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"

	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/rules"
)

func (s *Server) ipvs(w http.ResponseWriter, r *http.Request) {
	if s.cfg.IPVS == nil {
		writeText(w, http.StatusServiceUnavailable, "no proxy configured\n")
		return
	}
	var opts rules.IPVSOptions
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		on   *bool
	}{{"stats", &opts.Stats}, {"rate", &opts.Rate}} {
		if !q.Has(p.name) {
			continue
		}
		v := q.Get(p.name)
		if v == "" {
			*p.on = true
			continue
		}
		on, err := strconv.ParseBool(v)
		if err != nil {
			writeText(w, http.StatusBadRequest, fmt.Sprintf("%s %q: want 1 or 0\n", p.name, v))
			return
		}
		*p.on = on
	}
	var b bytes.Buffer
	if err := rules.WriteIPVS(&b, ipvsOf(s.cfg.IPVS()), opts); err != nil {
		writeText(w, http.StatusInternalServerError, err.Error()+"\n")
		return
	}
	writeText(w, http.StatusOK, b.String())
}

// ipvsOf converts proxy's snapshot to rules' input, field for field; the
// scheduler becomes its name ("random" for the zero config) and its flags
// by the names ipvsadm prints.
func ipvsOf(in []proxy.VirtualService) []rules.VirtualService {
	out := make([]rules.VirtualService, len(in))
	for i, v := range in {
		name := v.Scheduler.Name
		if name == "" {
			name = "random"
		}
		dests := make([]rules.Destination, len(v.Dests))
		for j, d := range v.Dests {
			dests[j] = rules.Destination{
				Addr: d.Addr, Weight: d.Weight, ActiveConn: d.ActiveConn, InActConn: d.InActConn,
				Stats: rules.IPVSStats(d.Stats),
			}
		}
		out[i] = rules.VirtualService{
			Name: v.Name, Protocol: v.Protocol, Addr: v.Addr,
			Scheduler: name, SchedFlags: v.Scheduler.FlagNames(),
			Persistent: v.Persistent, Affinity: v.Affinity,
			Dests: dests, Stats: rules.IPVSStats(v.Stats),
		}
	}
	return out
}
