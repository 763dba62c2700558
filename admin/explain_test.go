package admin_test

import (
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// TestExplainEndpoint: /debug/explain reads to, from, protocol and
// nodeport, answers the explanation as JSON, and refuses a query that does
// not parse with a 400 saying which parameter; without Explain it is 404.
func TestExplainEndpoint(t *testing.T) {
	var got proxy.ExplainQuery
	h := admin.New(admin.Config{
		Explain: func(q proxy.ExplainQuery) proxy.Explanation {
			got = q
			return proxy.Explanation{Verdict: "FORWARD", Port: "default/web:http"}
		},
		Destination: func(s string) (netip.AddrPort, error) {
			if s == "web.default:80" {
				return netip.MustParseAddrPort("10.96.0.20:80"), nil
			}
			return netip.ParseAddrPort(s)
		},
	}).Handler()
	code, body := get(t, h, "GET", "/debug/explain?to=web.default:80&from=192.0.2.7&protocol=udp&nodeport=true")
	var a admin.ExplainAnswer
	if code != http.StatusOK || json.Unmarshal([]byte(body), &a) != nil {
		t.Fatalf("%d %s", code, body)
	}
	if a.Destination != "10.96.0.20:80" || a.Client != "192.0.2.7" || a.Protocol != "UDP" || !a.NodePort || a.Verdict != "FORWARD" ||
		got.Protocol != service.UDP || got.Client != netip.MustParseAddr("192.0.2.7") || !got.NodePort {
		t.Errorf("answer %+v for query %+v", a, got)
	}
	for q, want := range map[string]string{
		"?to=nonsense&from=192.0.2.7":                    "to:",
		"?to=10.96.0.20:80&from=":                        "from:",
		"?to=10.96.0.20:80&from=192.0.2.7&protocol=sctp": "protocol:",
	} {
		if code, body := get(t, h, "GET", "/debug/explain"+q); code != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("%s: %d %q, want 400 naming %q", q, code, body, want)
		}
	}
	if code, _ := get(t, admin.New(admin.Config{}).Handler(), "GET", "/debug/explain?to=10.96.0.20:80&from=192.0.2.7"); code != http.StatusNotFound {
		t.Errorf("without Explain: %d", code)
	}
}
