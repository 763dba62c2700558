package balancer

import "net/netip"

// Picker chooses the endpoint of one service port for a new connection: the
// affinity checks first (when the service port has ClientIP affinity), then
// the lottery, then the --set of the chosen endpoint's list. It is safe for
// concurrent use when its Source is.
type Picker struct {
	lottery  *Lottery
	rand     Source
	affinity *Affinity // nil without ClientIP affinity
}

// NewPicker returns a Picker for one service port. affinity is nil for
// sessionAffinity: None.
func NewPicker(l *Lottery, r Source, affinity *Affinity) *Picker {
	return &Picker{lottery: l, rand: r, affinity: affinity}
}

// Affinity returns the affinity state, nil when the service port has none.
func (p *Picker) Affinity() *Affinity { return p.affinity }

// Pick returns the index into keys (the service port's endpoints in kube-proxy
// order, "ip:port" strings) of the endpoint for a new connection from client,
// and whether affinity decided it. It returns -1 for no endpoints. Call it
// once per new connection: with affinity it refreshes client's timestamp.
func (p *Picker) Pick(keys []string, client netip.Addr) (index int, byAffinity bool) {
	if len(keys) == 0 {
		return -1, false
	}
	if p.affinity == nil {
		return p.lottery.Pick(len(keys), p.rand), false
	}
	return p.affinity.pick(keys, client, func() int { return p.lottery.Pick(len(keys), p.rand) })
}
