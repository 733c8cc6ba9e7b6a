package nflog

import "testing"

func TestParseFlow(t *testing.T) {
	// IPv4 + TCP SYN to 198.18.0.7:8080.
	ip := []byte{0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 234, 0, 1, 198, 18, 0, 7}
	tcp := []byte{0xc3, 0x50, 0x1f, 0x90, 0, 0, 0, 0}
	f, ok := ParseFlow(append(ip, tcp...))
	if !ok || f.Proto != "tcp" || f.Dst != "198.18.0.7" || f.Port != 8080 {
		t.Errorf("tcp: %+v %v", f, ok)
	}
	ip[9] = 1 // ICMP
	if f, ok := ParseFlow(ip); !ok || f.Proto != "icmp" || f.Port != 0 {
		t.Errorf("icmp: %+v %v", f, ok)
	}
	for _, bad := range [][]byte{nil, {0x45, 0}, {0x60, 0, 0}, {0x15}} {
		if f, ok := ParseFlow(bad); ok {
			t.Errorf("%x parsed as %+v", bad, f)
		}
	}
}
