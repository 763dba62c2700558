package handover

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"
)

// TestSnapshotRoundTrip: every field type written by Enc reads back the
// same with Dec, sections by id, and the section read to its end.
func TestSnapshotRoundTrip(t *testing.T) {
	var s Snapshot
	s.Section(7, func(e *Enc) {
		e.U8(0xab)
		e.U16(0xbeef)
		e.U32(0xdeadbeef)
		e.U64(1 << 60)
		e.Bool(true)
		e.Int(-42)
		e.Duration(1500 * time.Millisecond)
		e.Bytes([]byte{1, 2, 3})
		e.String("flows")
		e.Addr(netip.MustParseAddr("10.96.0.10"))
		e.Addr(netip.Addr{})
		e.AddrPort(netip.MustParseAddrPort("[fd00::1]:443"))
	})
	s.Section(1, func(e *Enc) { e.U32(5) })
	secs, err := Sections(s.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(secs) != 2 {
		t.Fatalf("%d sections", len(secs))
	}
	d := NewDec(secs[7])
	got := []any{d.U8(), d.U16(), d.U32(), d.U64(), d.Bool(), d.Int(), d.Duration(time.Hour), string(d.Bytes()), d.String(), d.Addr(), d.Addr(), d.AddrPort()}
	want := []any{uint8(0xab), uint16(0xbeef), uint32(0xdeadbeef), uint64(1 << 60), true, int64(-42), 1500 * time.Millisecond, "\x01\x02\x03", "flows",
		netip.MustParseAddr("10.96.0.10"), netip.Addr{}, netip.MustParseAddrPort("[fd00::1]:443")}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d: %v, want %v", i, got[i], want[i])
		}
	}
	if err := d.End(); err != nil {
		t.Fatal(err)
	}
	if d := NewDec(secs[1]); d.U32() != 5 || d.End() != nil {
		t.Fatal("section 1")
	}
}

// TestSnapshotRefused: another format is refused as unknown, a flipped
// byte or a cut body as corrupt, and reads past a section's end or out of
// a field's range as corrupt, without panicking.
func TestSnapshotRefused(t *testing.T) {
	var s Snapshot
	s.Section(1, func(e *Enc) { e.String("hello") })
	good := s.Bytes()

	other := bytes.Clone(good)
	binary.BigEndian.PutUint16(other[8:], Format+1)
	flipped := bytes.Clone(good)
	flipped[len(flipped)-1] ^= 1
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"another format": {other, ErrFormat},
		"not a snapshot": {[]byte("GET / HTTP/1.1\r\n\r\n..."), ErrFormat},
		"flipped byte":   {flipped, ErrCorrupt},
		"cut":            {good[:len(good)-2], ErrCorrupt},
		"empty":          {nil, ErrFormat},
	} {
		if _, err := Sections(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	d := NewDec([]byte{0, 0, 0, 9, 'x'}) // a string of 9 bytes with 1 left
	if _ = d.String(); !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("a string past the end: %v", d.Err())
	}
	d = NewDec([]byte{0xff, 0xff, 0xff, 0xff})
	if n := d.Count(8); n != 0 || !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("a count the section cannot hold: %d, %v", n, d.Err())
	}
	d = NewDec(binary.BigEndian.AppendUint64(nil, uint64(1<<63)))
	if d.Duration(time.Hour); !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("a negative duration: %v", d.Err())
	}
	d = NewDec([]byte{2})
	if d.Bool(); !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("a boolean of 2: %v", d.Err())
	}
	d = NewDec([]byte{5, 1, 2, 3, 4, 5})
	if d.Addr(); !errors.Is(d.Err(), ErrCorrupt) {
		t.Fatalf("an address of 5 bytes: %v", d.Err())
	}
}

// FuzzSnapshot feeds any bytes to Sections, and every section it accepts
// to a decoder reading fields in an order the input picks: errors, never
// a panic, and no allocation beyond what the input holds. The same input,
// wrapped in a valid header, reaches the sections too.
func FuzzSnapshot(f *testing.F) {
	var s Snapshot
	s.Section(1, func(e *Enc) {
		e.U32(2)
		e.AddrPort(netip.MustParseAddrPort("10.0.0.1:80"))
		e.String("x")
	})
	f.Add(s.Bytes(), []byte{6, 9, 3})
	f.Add([]byte("UPXSNAP1"), []byte{0})
	f.Fuzz(func(t *testing.T, b, reads []byte) {
		walk := func(b []byte) {
			secs, err := Sections(b)
			if err != nil {
				if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("an error that is neither ErrFormat nor ErrCorrupt: %v", err)
				}
				return
			}
			for _, sec := range secs {
				d := NewDec(sec)
				for _, r := range reads {
					switch r % 11 {
					case 0:
						d.U8()
					case 1:
						d.U16()
					case 2:
						d.U32()
					case 3:
						d.U64()
					case 4:
						d.Bool()
					case 5:
						d.Duration(time.Hour)
					case 6:
						if n := d.Count(16); n > len(sec)/16 {
							t.Fatalf("a count of %d in a section of %d bytes", n, len(sec))
						}
					case 7:
						if v := d.Bytes(); len(v) > len(sec) {
							t.Fatal("bytes longer than the section")
						}
					case 8:
						_ = d.String()
					case 9:
						d.Addr()
					case 10:
						d.AddrPort()
					}
				}
				if err := d.End(); err != nil && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("a decoder error that is not ErrCorrupt: %v", err)
				}
			}
		}
		walk(b)
		var s Snapshot
		s.body = b // any body, a valid header around it
		walk(s.Bytes())
	})
}
