package handover

// The snapshot's container: what the old process's state becomes on the
// way to the new one.
//
//	header  magic "UPXSNAP1" | format uint16 | reserved uint16 | body length uint32 | CRC-32C(body) uint32
//	body    section*
//	section id uint16 | length uint32 | bytes
//
// Integers are big-endian. The format number names everything inside:
// a reader refuses a format it does not know (ErrFormat) rather than guess,
// and the run command then starts clean. Sections are written by their
// owners with Enc and read with Dec, whose reads are bounded by the
// section: a short or malformed section is an error, never a panic.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"net/netip"
	"time"
)

// Format is the snapshot format this build writes and reads.
const Format = 1

var magic = [8]byte{'U', 'P', 'X', 'S', 'N', 'A', 'P', '1'}

const headerLen = 8 + 2 + 2 + 4 + 4

// MaxSnapshot bounds a snapshot's body: a node's worth of flows (a
// million conntrack entries at about a hundred bytes) and room to spare.
const MaxSnapshot = 256 << 20

// ErrFormat is a snapshot this build cannot read: another format number,
// or not a snapshot at all.
var ErrFormat = errors.New("handover: snapshot format not known")

// ErrCorrupt is a snapshot whose checksum, lengths or fields do not hold.
var ErrCorrupt = errors.New("handover: snapshot corrupt")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot builds a snapshot's body section by section.
type Snapshot struct {
	body []byte
}

// Section appends section id, whose bytes fill writes.
func (s *Snapshot) Section(id uint16, fill func(e *Enc)) {
	s.body = binary.BigEndian.AppendUint16(s.body, id)
	at := len(s.body)
	s.body = append(s.body, 0, 0, 0, 0)
	e := Enc{b: s.body}
	fill(&e)
	s.body = e.b
	binary.BigEndian.PutUint32(s.body[at:], uint32(len(s.body)-at-4))
}

// Bytes returns the whole snapshot, header and body.
func (s *Snapshot) Bytes() []byte {
	out := make([]byte, headerLen, headerLen+len(s.body))
	copy(out, magic[:])
	binary.BigEndian.PutUint16(out[8:], Format)
	binary.BigEndian.PutUint32(out[12:], uint32(len(s.body)))
	binary.BigEndian.PutUint32(out[16:], crc32.Checksum(s.body, castagnoli))
	return append(out, s.body...)
}

// Sections checks a snapshot's header and checksum and returns its
// sections by id; a section id seen twice is corrupt.
func Sections(b []byte) (map[uint16][]byte, error) {
	if len(b) < headerLen || [8]byte(b[:8]) != magic {
		return nil, fmt.Errorf("%w: no snapshot header", ErrFormat)
	}
	if f := binary.BigEndian.Uint16(b[8:]); f != Format {
		return nil, fmt.Errorf("%w: format %d, this build reads %d", ErrFormat, f, Format)
	}
	n := binary.BigEndian.Uint32(b[12:])
	body := b[headerLen:]
	if n > MaxSnapshot || int64(n) != int64(len(body)) {
		return nil, fmt.Errorf("%w: body of %d bytes, header says %d", ErrCorrupt, len(body), n)
	}
	if sum := crc32.Checksum(body, castagnoli); sum != binary.BigEndian.Uint32(b[16:]) {
		return nil, fmt.Errorf("%w: checksum %08x, header says %08x", ErrCorrupt, sum, binary.BigEndian.Uint32(b[16:]))
	}
	out := map[uint16][]byte{}
	for len(body) > 0 {
		if len(body) < 6 {
			return nil, fmt.Errorf("%w: a section header cut short", ErrCorrupt)
		}
		id, l := binary.BigEndian.Uint16(body), binary.BigEndian.Uint32(body[2:])
		body = body[6:]
		if int64(l) > int64(len(body)) {
			return nil, fmt.Errorf("%w: section %d of %d bytes, %d left", ErrCorrupt, id, l, len(body))
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("%w: section %d twice", ErrCorrupt, id)
		}
		out[id], body = body[:l:l], body[l:]
	}
	return out, nil
}

// Enc appends a section's fields.
type Enc struct{ b []byte }

func (e *Enc) U8(v uint8)   { e.b = append(e.b, v) }
func (e *Enc) U16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *Enc) U32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *Enc) U64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }

// Bool is one byte, 0 or 1.
func (e *Enc) Bool(v bool) {
	if v {
		e.U8(1)
	} else {
		e.U8(0)
	}
}

// Int is a signed 64-bit integer.
func (e *Enc) Int(v int64) { e.U64(uint64(v)) }

// Duration is a time.Duration: timers travel as what is left of them, not
// as instants of one process's clock.
func (e *Enc) Duration(d time.Duration) { e.Int(int64(d)) }

// Bytes is a length (uint32) and the bytes.
func (e *Enc) Bytes(b []byte) { e.U32(uint32(len(b))); e.b = append(e.b, b...) }

// String is Bytes of s.
func (e *Enc) String(s string) { e.U32(uint32(len(s))); e.b = append(e.b, s...) }

// Addr is a length byte (0, 4 or 16) and the address's bytes; a zone is
// not kept.
func (e *Enc) Addr(a netip.Addr) {
	b := a.AsSlice()
	e.U8(uint8(len(b)))
	e.b = append(e.b, b...)
}

// AddrPort is Addr and the port.
func (e *Enc) AddrPort(ap netip.AddrPort) { e.Addr(ap.Addr()); e.U16(ap.Port()) }

// Dec reads a section's fields in the order Enc wrote them. The first
// read past the end, or of a malformed field, sets Err, and every later
// read returns zero values: a decoder checks Err once, at the end.
type Dec struct {
	b   []byte
	err error
}

// NewDec reads section b.
func NewDec(b []byte) *Dec { return &Dec{b: b} }

// Err is the first error a read met, wrapping ErrCorrupt.
func (d *Dec) Err() error { return d.err }

// Fail records a decoder's own check that failed (a value out of its
// range), unless an error came first.
func (d *Dec) Fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
}

// Left is the number of bytes not read yet.
func (d *Dec) Left() int { return len(d.b) }

func (d *Dec) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.Fail("a field of %d bytes with %d left", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *Dec) U8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *Dec) U16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *Dec) U32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *Dec) U64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// Bool reads a byte that must be 0 or 1.
func (d *Dec) Bool() bool {
	v := d.U8()
	if v > 1 {
		d.Fail("a boolean of %d", v)
	}
	return v == 1
}

// Int reads a signed 64-bit integer.
func (d *Dec) Int() int64 { return int64(d.U64()) }

// Duration reads a time.Duration, which must lie within [0, limit].
func (d *Dec) Duration(limit time.Duration) time.Duration {
	v := time.Duration(d.Int())
	if v < 0 || v > limit {
		d.Fail("a duration of %v, outside [0, %v]", v, limit)
		return 0
	}
	return v
}

// Count reads a count of items that take at least each bytes: a count
// the section cannot hold is corrupt (no allocation follows it).
func (d *Dec) Count(each int) int {
	n := d.U32()
	if d.err == nil && (n > math.MaxInt32 || int64(n)*int64(max(each, 1)) > int64(len(d.b))) {
		d.Fail("%d items of at least %d bytes with %d left", n, each, len(d.b))
		return 0
	}
	return int(n)
}

// Bytes reads a length and that many bytes (a view of the section).
func (d *Dec) Bytes() []byte { return d.take(d.Count(1)) }

// String reads Bytes as a string.
func (d *Dec) String() string { return string(d.Bytes()) }

// Addr reads an address: a length of 0 (none), 4 or 16 and its bytes.
func (d *Dec) Addr() netip.Addr {
	switch n := d.U8(); n {
	case 0:
		return netip.Addr{}
	case 4:
		if b := d.take(4); b != nil {
			return netip.AddrFrom4([4]byte(b))
		}
	case 16:
		if b := d.take(16); b != nil {
			return netip.AddrFrom16([16]byte(b))
		}
	default:
		d.Fail("an address of %d bytes", n)
	}
	return netip.Addr{}
}

// AddrPort reads Addr and a port.
func (d *Dec) AddrPort() netip.AddrPort {
	a := d.Addr()
	return netip.AddrPortFrom(a, d.U16())
}

// End checks that the section was read to its end.
func (d *Dec) End() error {
	if d.err == nil && len(d.b) > 0 {
		d.Fail("%d bytes left over", len(d.b))
	}
	return d.err
}
