// Package etcfiles makes the files that tell a sandbox who and where it
// is: /etc/hosts, /etc/hostname and /etc/resolv.conf, as Docker and
// Podman give every container its own. An image's copies name the machine
// that built it (debootstrap copies the build host's hostname and
// resolver) or are missing, and without a hosts file `localhost` does not
// resolve: every test suite that binds it fails or hangs.
//
// The files depend only on the sandbox's hostname and network, so a
// backend can write them wherever its root is made (the container
// backend: into the sandbox's writable layer) and a commit can tell
// whether the sandbox changed them.
package etcfiles

import (
	"bytes"
	"net/netip"
	"strings"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Network is a sandbox's network mode, which decides its resolver.
type Network string

// None is a sandbox with loopback only: no nameserver at all (glibc then
// tries 127.0.0.1, which refuses at once), never the node's resolver,
// which the sandbox cannot reach and should not learn about.
const None Network = "none"

// File is one file of /etc.
type File struct {
	Name string // under /etc: "hosts", "hostname", "resolv.conf"
	Data []byte
}

// Names are the files Warren writes, in the order Files returns them.
var Names = []string{"hosts", "hostname", "resolv.conf"}

// Files returns the sandbox's /etc files for hostname and network.
//
// The hostname maps to 127.0.1.1, as Debian's installer maps a machine
// without a fixed address: it resolves (getent, Python's getfqdn, Java's
// getLocalHost), it is on loopback (all of 127/8 is), and binding it does
// not take 127.0.0.1's ports.
func Files(hostname string, network Network) []File {
	var hosts strings.Builder
	hosts.WriteString("127.0.0.1\tlocalhost\n")
	hosts.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	hosts.WriteString("fe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
	if hostname != "" && hostname != "localhost" {
		hosts.WriteString("127.0.1.1\t" + hostname)
		if short, _, ok := strings.Cut(hostname, "."); ok {
			hosts.WriteString(" " + short)
		}
		hosts.WriteString("\n")
	}
	return []File{
		{Name: "hosts", Data: []byte(hosts.String())},
		{Name: "hostname", Data: []byte(hostname + "\n")},
		{Name: "resolv.conf", Data: resolvConf(network)},
	}
}

func resolvConf(network Network) []byte {
	switch network {
	default: // None; a sandbox with a network gets WithNameserver's
		return []byte("# Written by Warren. This sandbox has no network: no resolver.\n")
	}
}

// ResolvConf is the resolv.conf of a sandbox with a network: its
// gateway, where Warren's resolver answers it (internal/resolver), and
// nothing of the node's. No search domain: group members' names are
// single labels the resolver answers as asked. glibc's default 5 s
// timeout is kept short: the resolver is on the other end of a veth.
// Without a nameserver (the zero Addr) it is mode none's.
func ResolvConf(nameserver netip.Addr) []byte {
	if !nameserver.IsValid() {
		return resolvConf(None)
	}
	return []byte("# Written by Warren: the sandbox's resolver is Warren's, at its gateway.\nnameserver " +
		nameserver.String() + "\noptions timeout:2 attempts:3\n")
}

// WithNameserver returns files with resolv.conf (if there is one) naming
// nameserver (none for the zero Addr).
func WithNameserver(files []File, nameserver netip.Addr) []File {
	out := make([]File, len(files))
	copy(out, files)
	for i, f := range out {
		if f.Name == "resolv.conf" {
			out[i].Data = ResolvConf(nameserver)
		}
	}
	return out
}

// Unchanged reports whether data is what Files wrote for name: a commit
// leaves such files out, so a layer made from a sandbox does not carry
// its hostname.
func Unchanged(name string, data []byte, hostname string, network Network) bool {
	for _, f := range Files(hostname, network) {
		if f.Name == name {
			return bytes.Equal(f.Data, data)
		}
	}
	return false
}

// MaxHostname is the kernel's limit (HOST_NAME_MAX).
const MaxHostname = 64

// CheckHostname returns an invalid error unless h is a DNS name of
// RFC 1123 labels (letters, digits and '-', 1 to 63 each, not starting
// or ending with '-'), at most MaxHostname bytes, without a trailing dot.
func CheckHostname(h string) error {
	if h == "" {
		return errdefs.Invalidf("empty hostname")
	}
	if len(h) > MaxHostname {
		return errdefs.Invalidf("hostname %q is %d bytes; at most %d", h, len(h), MaxHostname)
	}
	for _, label := range strings.Split(h, ".") {
		if err := checkLabel(label); err != nil {
			return errdefs.Invalidf("invalid hostname %q: %s (RFC 1123: labels of letters, digits and '-', separated by '.')", h, err)
		}
	}
	return nil
}

type labelError string

func (e labelError) Error() string { return string(e) }

func checkLabel(l string) error {
	switch {
	case l == "":
		return labelError("empty label")
	case len(l) > 63:
		return labelError("a label is longer than 63 bytes")
	case l[0] == '-' || l[len(l)-1] == '-':
		return labelError("a label starts or ends with '-'")
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return labelError("'" + string(rune(c)) + "' is not a letter, digit or '-'")
		}
	}
	return nil
}

// HostnameFor is the default hostname of a sandbox id
// ([a-z0-9][a-z0-9_.-]{0,62}): the id with '_' made '-', and where that
// is still no DNS name (an empty label, a label ending in '-'), with '.'
// made '-' too and trailing '-' cut.
func HostnameFor(id string) string {
	h := strings.ReplaceAll(id, "_", "-")
	if CheckHostname(h) == nil {
		return h
	}
	h = strings.TrimRight(strings.ReplaceAll(h, ".", "-"), "-")
	if CheckHostname(h) == nil {
		return h
	}
	return "sandbox"
}
