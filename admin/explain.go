package admin

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"

	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// ExplainAnswer is /debug/explain's JSON: the flow as read, and what it
// would meet.
type ExplainAnswer struct {
	Destination string `json:"destination"`
	Client      string `json:"client"`
	Protocol    string `json:"protocol"`
	NodePort    bool   `json:"nodePort,omitempty"`
	proxy.Explanation
}

// explain serves /debug/explain?to=DEST&from=CLIENT[&protocol=udp][&nodeport=true]:
// what a new flow would meet, as JSON (userproxy explain prints it). A
// query that does not parse is a 400 saying why.
func (s *Server) explain(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	bad := func(msg string) { http.Error(w, msg, http.StatusBadRequest) }
	dst, err := s.cfg.Destination(q.Get("to"))
	if err != nil {
		bad("to: " + err.Error())
		return
	}
	client, err := netip.ParseAddr(q.Get("from"))
	if err != nil {
		bad("from: want the client's IP address: " + err.Error())
		return
	}
	proto := service.TCP
	switch strings.ToLower(q.Get("protocol")) {
	case "", "tcp":
	case "udp":
		proto = service.UDP
	default:
		bad("protocol: want tcp or udp")
		return
	}
	nodePort := q.Get("nodeport") == "true"
	ans := ExplainAnswer{Destination: dst.String(), Client: client.Unmap().String(), Protocol: proto.String(), NodePort: nodePort,
		Explanation: s.cfg.Explain(proxy.ExplainQuery{Protocol: proto, Client: client.Unmap(), Destination: dst, NodePort: nodePort})}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ans)
}
