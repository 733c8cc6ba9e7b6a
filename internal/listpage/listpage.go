// Package listpage is the order and the pages of List, on a node and
// through a gateway alike: sandboxes sorted by creation time, then id,
// and a page token that names the last sandbox of the previous page, so
// that neither keeps any state between pages and a gateway merges the
// nodes' pages of one token into its own.
package listpage

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Sort sorts by creation time, then id.
func Sort(sbs []*warrenv1.Sandbox) {
	slices.SortFunc(sbs, func(a, b *warrenv1.Sandbox) int {
		if c := cmp.Compare(a.GetCreatedAtUnixMs(), b.GetCreatedAtUnixMs()); c != 0 {
			return c
		}
		return strings.Compare(a.GetId(), b.GetId())
	})
}

// Token is the position after sb in the order List returns
// (creation time, then id): a page token means "the sandboxes after
// this one", which nodes and gateways compute alike without state.
func Token(sb *warrenv1.Sandbox) string {
	return strconv.FormatInt(sb.GetCreatedAtUnixMs(), 10) + "." + sb.GetId()
}

// After reports whether sb comes after the position tok names.
func After(sb *warrenv1.Sandbox, tok string) (bool, error) {
	if tok == "" {
		return true, nil
	}
	ms, id, ok := strings.Cut(tok, ".")
	t, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return false, errdefs.Invalidf("bad page token %q", tok)
	}
	c := sb.GetCreatedAtUnixMs()
	return c > t || c == t && sb.GetId() > id, nil
}

// Cut cuts a sorted list to the page that req asks for.
func Cut(all []*warrenv1.Sandbox, req *warrenv1.ListRequest) (*warrenv1.ListResponse, error) {
	if req.GetPageSize() < 0 {
		return nil, errdefs.Invalidf("negative page size %d", req.GetPageSize())
	}
	start := 0
	for start < len(all) {
		ok, err := After(all[start], req.GetPageToken())
		if err != nil {
			return nil, err
		}
		if ok {
			break
		}
		start++
	}
	all = all[start:]
	resp := &warrenv1.ListResponse{Sandboxes: all}
	if n := int(req.GetPageSize()); n > 0 && len(all) > n {
		resp.Sandboxes = all[:n]
		resp.NextPageToken = Token(all[n-1])
	}
	return resp, nil
}
