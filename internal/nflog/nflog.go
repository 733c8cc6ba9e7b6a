// Package nflog reads the packets an nftables `log group N` rule hands
// to userspace (NFLOG, nfnetlink_log): which interface a packet came in
// on and its first bytes. The network policy logs the packets it refuses
// there, so that each refusal becomes a security event of the sandbox
// that sent it.
//
// One socket binds a group; the kernel refuses a second (EBUSY), so each
// daemon on a node uses a group of its own. Packets are copied up to a
// snap length, enough for the IP and transport headers.
package nflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnetlink_log's message types and attributes (linux/netfilter/nfnetlink_log.h).
const (
	subsysULOG   = 4 // NFNL_SUBSYS_ULOG
	msgPacket    = 0 // NFULNL_MSG_PACKET
	msgConfig    = 1 // NFULNL_MSG_CONFIG
	cfgCmd       = 1 // NFULA_CFG_CMD
	cfgMode      = 2 // NFULA_CFG_MODE
	cfgQThresh   = 5 // NFULA_CFG_QTHRESH
	cmdBind      = 1 // NFULNL_CFG_CMD_BIND
	copyPacket   = 2 // NFULNL_COPY_PACKET
	attrIndev    = 4 // NFULA_IFINDEX_INDEV
	attrPayload  = 9 // NFULA_PAYLOAD
	attrPrefix   = 10
	nfnetlinkV0  = 0
	headerLength = 4 // struct nfgenmsg
)

// Packet is one logged packet.
type Packet struct {
	InIfindex uint32 // the interface it came in on (0: none)
	Prefix    string // the rule's log prefix
	Payload   []byte // its first bytes, from the network header on
}

// Reader is a bound NFLOG group.
type Reader struct {
	c     *netlink.Conn
	group uint16
}

// Open binds group, copying snap bytes of each packet.
func Open(group uint16, snap uint32) (*Reader, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, fmt.Errorf("nflog: netfilter netlink socket: %w", err)
	}
	r := &Reader{c: c, group: group}
	mode := make([]byte, 6) // struct nfulnl_msg_config_mode: be32 range, u8 mode, pad
	binary.BigEndian.PutUint32(mode, snap)
	mode[4] = copyPacket
	qthresh := binary.BigEndian.AppendUint32(nil, 1) // each packet at once
	for _, attrs := range [][]netlink.Attribute{
		{{Type: cfgCmd, Data: []byte{cmdBind}}},
		{{Type: cfgMode, Data: mode}, {Type: cfgQThresh, Data: qthresh}},
	} {
		if err := r.config(attrs); err != nil {
			c.Close()
			if errors.Is(err, unix.EBUSY) {
				return nil, fmt.Errorf("nflog: group %d is bound by another process: %w", group, err)
			}
			return nil, fmt.Errorf("nflog: configure group %d: %w", group, err)
		}
	}
	_ = c.SetReadBuffer(1 << 20) // a burst beyond it is lost (ENOBUFS), not queued without bound
	return r, nil
}

func (r *Reader) config(attrs []netlink.Attribute) error {
	body, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_UNSPEC, nfnetlinkV0, 0, 0}
	binary.BigEndian.PutUint16(hdr[2:], r.group)
	_, err = r.c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(subsysULOG<<8 | msgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(hdr, body...),
	})
	return err
}

// Read blocks for the next batch of packets. An error wrapping
// unix.ENOBUFS says the kernel dropped some (the reader was too slow);
// reading may go on.
func (r *Reader) Read() ([]Packet, error) {
	msgs, err := r.c.Receive()
	if err != nil {
		return nil, err
	}
	var out []Packet
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(subsysULOG<<8|msgPacket) || len(m.Data) < headerLength {
			continue
		}
		p, err := parse(m.Data[headerLength:])
		if err == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

func parse(b []byte) (Packet, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return Packet{}, err
	}
	ad.ByteOrder = binary.BigEndian
	var p Packet
	for ad.Next() {
		switch ad.Type() {
		case attrIndev:
			p.InIfindex = ad.Uint32()
		case attrPayload:
			p.Payload = ad.Bytes()
		case attrPrefix:
			p.Prefix = ad.String()
		}
	}
	return p, ad.Err()
}

// Close unbinds the group (the socket's close does) and ends a Read.
func (r *Reader) Close() error { return r.c.Close() }

// Flow is what a packet's headers say: protocol, destination and its
// port (TCP and UDP), for IPv4 and IPv6.
type Flow struct {
	Proto string // "tcp", "udp", "icmp", or the protocol number
	Dst   string // address
	Port  uint16 // 0 where the protocol has none
}

// ParseFlow reads the network and transport headers of payload.
func ParseFlow(payload []byte) (Flow, bool) {
	if len(payload) < 1 {
		return Flow{}, false
	}
	var proto byte
	var dst, l4 []byte
	switch payload[0] >> 4 {
	case 4:
		ihl := int(payload[0]&0x0f) * 4
		if len(payload) < 20 || ihl < 20 {
			return Flow{}, false
		}
		proto, dst = payload[9], payload[16:20]
		if len(payload) > ihl {
			l4 = payload[ihl:]
		}
	case 6:
		if len(payload) < 40 {
			return Flow{}, false
		}
		proto, dst, l4 = payload[6], payload[24:40], payload[40:]
	default:
		return Flow{}, false
	}
	f := Flow{Dst: fmtAddr(dst)}
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		f.Proto = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[proto]
		if len(l4) >= 4 {
			f.Port = binary.BigEndian.Uint16(l4[2:4])
		}
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		f.Proto = "icmp"
	default:
		f.Proto = fmt.Sprint(proto)
	}
	return f, true
}

func fmtAddr(b []byte) string {
	if a, ok := netip.AddrFromSlice(b); ok {
		return a.String()
	}
	return ""
}
