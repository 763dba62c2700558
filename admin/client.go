package admin

// Client helpers for the CLI (`userproxy conntrack list|flush`, `userproxy
// rules`, `userproxy ipvs`), which talk to a running proxy's admin server.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// maxResponse bounds what the helpers read from the server.
const maxResponse = 256 << 20

// httpClient talks to the admin server: no proxy from the environment (the
// server is local) and no idle connections left behind.
var httpClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

// unixClient talks to the control socket at path.
func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}}}
}

// FetchConntrack returns the entries of the proxy at adminAddr that q
// selects, one `conntrack -L` line each, sorted. adminAddr is "host:port"
// or a base URL such as "http://host:port"; "" means DefaultAddr.
func FetchConntrack(ctx context.Context, adminAddr string, q ConntrackQuery) (string, error) {
	return call(ctx, http.MethodGet, adminAddr, "/debug/conntrack", queryOf(q))
}

// FlushConntrack deletes the entries of the proxy at adminAddr that q
// selects (the zero query deletes them all, like `conntrack -F`) and
// returns how many it deleted. adminAddr is the control socket as
// "unix:PATH": only it serves the flush.
func FlushConntrack(ctx context.Context, adminAddr string, q ConntrackQuery) (int, error) {
	body, err := call(ctx, http.MethodPost, adminAddr, "/debug/conntrack/flush", queryOf(q))
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(body))
	if err != nil {
		return 0, fmt.Errorf("admin server at %s: unexpected flush answer %q", adminAddr, body)
	}
	return n, nil
}

// FetchRules returns the rules of the proxy at adminAddr, as rules.Write
// prints them with the server's options and this format and family (zero:
// both families).
func FetchRules(ctx context.Context, adminAddr string, format rules.Format, family service.Family) (string, error) {
	v := url.Values{"format": {format.String()}}
	if family != 0 {
		v.Set("family", strconv.Itoa(int(family)))
	}
	return call(ctx, http.MethodGet, adminAddr, "/debug/rules", v)
}

// FetchIPVS returns the service table of the proxy at adminAddr as
// `ipvsadm -Ln` lists it, with --stats or --rate when asked (stats wins
// when both are, as in ipvsadm).
func FetchIPVS(ctx context.Context, adminAddr string, stats, rate bool) (string, error) {
	v := url.Values{}
	if stats {
		v.Set("stats", "1")
	}
	if rate {
		v.Set("rate", "1")
	}
	return call(ctx, http.MethodGet, adminAddr, "/debug/ipvs", v)
}

func queryOf(q ConntrackQuery) url.Values {
	v := url.Values{}
	for k, val := range q.values() {
		if val != "" {
			v.Set(k, val)
		}
	}
	return v
}

// baseURL turns an admin address into a URL without a trailing slash.
func baseURL(adminAddr string) string {
	if adminAddr == "" {
		adminAddr = DefaultAddr
	}
	if strings.HasPrefix(adminAddr, "unix:") {
		return "http://control"
	}
	if strings.Contains(adminAddr, "://") {
		return strings.TrimSuffix(adminAddr, "/")
	}
	return "http://" + adminAddr
}

// call makes one request and returns the body of a 200 answer; any other
// status is an error carrying the server's text.
func call(ctx context.Context, method, adminAddr, path string, q url.Values) (string, error) {
	u := baseURL(adminAddr) + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return "", fmt.Errorf("admin: %w", err)
	}
	client := httpClient
	where := baseURL(adminAddr)
	if path, ok := strings.CutPrefix(adminAddr, "unix:"); ok {
		client, where = unixClient(path), "control socket "+path
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s: %w", where, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return "", fmt.Errorf("admin server at %s: reading %s: %w", baseURL(adminAddr), path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("admin server at %s: %s %s: %s: %s", baseURL(adminAddr), method, path, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

// FetchExplain asks the proxy at adminAddr what a new flow from client to
// dst (IP:PORT or a service's name and port) would meet
// (/debug/explain).
func FetchExplain(ctx context.Context, adminAddr, dst, client, protocol string, nodePort bool) (ExplainAnswer, error) {
	q := url.Values{"to": {dst}, "from": {client}, "protocol": {protocol}}
	if nodePort {
		q.Set("nodeport", "true")
	}
	body, err := call(ctx, http.MethodGet, adminAddr, "/debug/explain", q)
	if err != nil {
		return ExplainAnswer{}, err
	}
	var a ExplainAnswer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		return ExplainAnswer{}, fmt.Errorf("admin server at %s: /debug/explain: %w", baseURL(adminAddr), err)
	}
	return a, nil
}
