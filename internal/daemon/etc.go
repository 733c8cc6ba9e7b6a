package daemon

import (
	"context"
	"net/netip"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/etcfiles"
)

// A sandbox's /etc/resolv.conf is Warren's until the sandbox changes it:
// written at create (mode none's names no nameserver; with a network the
// backend names its resolver), and rewritten when an update gives the
// sandbox a network or takes it away, but only while it still holds what
// Warren last wrote. The sandbox's etcNS, kept in its record, says what
// that was: commits leave exactly that file out (etcFilesOf).

const resolvPath = "/etc/resolv.conf"

func formatNameserver(a netip.Addr) string {
	if a.IsValid() {
		return a.String()
	}
	return ""
}

// parseNameserver reads a record's EtcNameserver; "" (and anything
// unreadable) is mode none's file.
func parseNameserver(s string) netip.Addr {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}
	}
	return a
}

// nameserverOf is where sb's resolver is now, for a sandbox whose /etc
// files are Warren's; the zero Addr without a network, with keep_etc, or
// for a backend that does not say (backend.Resolved).
func nameserverOf(sb backend.Sandbox, keepEtc bool) netip.Addr {
	if r, ok := sb.(backend.Resolved); ok && !keepEtc {
		return r.Nameserver()
	}
	return netip.Addr{}
}

// resolvRewrite is what an update did to the sandbox's resolv.conf.
type resolvRewrite struct {
	from, to netip.Addr
	done     bool // the file named from and now names to
}

// followNetwork rewrites the sandbox's resolv.conf after its network
// changed: from naming from (what Warren last wrote) to naming where its
// resolver is now, atomically, through the sandbox's file layer (inside
// its root, as its root in a user namespace), and only while the file
// still holds what Warren wrote. A file the sandbox edited, replaced or
// removed is left alone, and so is keep_etc's image file.
//
// A failure is logged, not returned: the network change stands (cutting
// a sandbox's network must not wait on its full disk), and the file,
// replaced whole or not at all, is still what the record says.
func (m *Manager) followNetwork(ctx context.Context, id string, sb backend.Sandbox, fs backend.FileSystem, keepEtc bool, from netip.Addr) resolvRewrite {
	rw := resolvRewrite{from: from, to: nameserverOf(sb, keepEtc)}
	r, ok := fs.(backend.FileReplacer)
	if keepEtc || rw.to == from || !ok {
		return rw
	}
	done, err := r.ReplaceIf(ctx, resolvPath, etcfiles.ResolvConf(from), etcfiles.ResolvConf(rw.to))
	rw.done = done
	switch {
	case err != nil:
		m.log.Warn("rewrite resolv.conf after a network change", "sandbox", id, "err", err)
	case !done:
		m.log.Debug("resolv.conf is the sandbox's own: left alone after a network change", "sandbox", id)
	}
	return rw
}

// undoResolv puts back what followNetwork wrote, while the file still
// holds it (the update failed after it).
func (m *Manager) undoResolv(ctx context.Context, id string, fs backend.FileSystem, rw resolvRewrite) {
	if !rw.done {
		return
	}
	if _, err := fs.(backend.FileReplacer).ReplaceIf(ctx, resolvPath, etcfiles.ResolvConf(rw.to), etcfiles.ResolvConf(rw.from)); err != nil {
		m.log.Warn("restore resolv.conf after a failed update", "sandbox", id, "err", err)
	}
}
