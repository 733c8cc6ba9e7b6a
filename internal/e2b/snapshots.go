package e2b

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Snapshots.
//
// An E2B snapshot is a Warren fork kept HIBERNATED: POST
// /sandboxes/{id}/snapshots forks the sandbox once (Fork: the source is
// checkpointed and goes back to the state it was in) and hibernates the
// copy, which is labelled as a snapshot and left out of the E2B list and
// of the sandbox calls. Sandbox.create(snapshotID) forks that copy once
// (a HIBERNATED source is not resumed: the new sandbox is restored from
// its checkpoint, copy-on-write over its files), and DELETE
// /templates/{snapshotID} deletes it. Nothing here checkpoints or copies
// anything itself. The copy inherits keep_while_paused from an E2B
// source, so a snapshot does not expire; one of a sandbox made through
// Warren's own API keeps the node's default lifetime (docs/E2B.md).

// snapshotPrefix starts every snapshot id and name this door hands out:
// a templateID with it names a snapshot, anything else a Warren image.
const snapshotPrefix = "snapshot:"

// The labels that mark a snapshot, and its name if it was given one.
const (
	snapshotLabel     = "warren.e2b/snapshot"
	snapshotNameLabel = "warren.e2b/snapshot-name"
)

func isSnapshot(sb *warrenv1.Sandbox) bool { return sb.GetLabels()[snapshotLabel] == "true" }

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotInfo(sb *warrenv1.Sandbox) snapshotInfo {
	si := snapshotInfo{SnapshotID: snapshotPrefix + sb.GetId(), Names: []string{}}
	if n := sb.GetLabels()[snapshotNameLabel]; n != "" {
		si.Names = append(si.Names, snapshotPrefix+n)
	}
	return si
}

// findSnapshot resolves a snapshot reference (its id or its name, with or
// without the prefix) to the snapshot; a name that several snapshots
// carried resolves to the newest.
func (s *Server) findSnapshot(r *http.Request, ref string) (*warrenv1.Sandbox, error) {
	ref = strings.TrimPrefix(ref, snapshotPrefix)
	if ref == "" {
		return nil, errdefs.Invalidf("empty snapshot id")
	}
	sb, err := s.m.Get(r.Context(), &warrenv1.GetRequest{Id: ref})
	if err == nil && isSnapshot(sb) {
		return sb, nil
	}
	if err != nil && httpStatus(err) != http.StatusNotFound {
		return nil, err
	}
	l, err := s.m.List(r.Context(), &warrenv1.ListRequest{Labels: map[string]string{snapshotLabel: "true", snapshotNameLabel: ref}})
	if err != nil {
		return nil, err
	}
	var newest *warrenv1.Sandbox
	for _, c := range l.GetSandboxes() {
		if newest == nil || c.GetCreatedAtUnixMs() > newest.GetCreatedAtUnixMs() {
			newest = c
		}
	}
	if newest == nil {
		return nil, errdefs.NotFoundf("snapshot %s not found", ref)
	}
	return newest, nil
}

// createSnapshot is POST /sandboxes/{id}/snapshots (201 SnapshotInfo).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name   string `json:"name"`
		Memory *bool  `json:"memory"`
	}
	if err := decode(r, &body); err != nil {
		s.fail(w, err)
		return
	}
	if body.Memory != nil && !*body.Memory {
		s.fail(w, errdefs.Unsupportedf("filesystem-only snapshots are not supported: a Warren snapshot holds memory and files (mode \"full\")"))
		return
	}
	if len(body.Name) > 200 || strings.ContainsAny(body.Name, "\x00") {
		s.fail(w, errdefs.Invalidf("snapshot name %q: want up to 200 bytes", body.Name))
		return
	}
	name := strings.TrimPrefix(body.Name, snapshotPrefix)
	id := r.PathValue("id")
	if _, err := s.visible(r, id); err != nil {
		s.fail(w, err)
		return
	}
	// As for fork: the checkpoint needs the source's agent idle.
	s.open.end(id, 5*time.Second)
	s.ports.CloseAll(id)
	labels := map[string]string{snapshotLabel: "true"}
	if name != "" {
		labels[snapshotNameLabel] = name
	}
	res, err := s.m.Fork(r.Context(), &warrenv1.ForkRequest{Id: id, Count: 1, Labels: labels})
	if err != nil {
		s.fail(w, err)
		return
	}
	snap := res.GetSandboxes()[0]
	h, err := s.m.Hibernate(r.Context(), &warrenv1.HibernateRequest{Id: snap.GetId()})
	if err != nil {
		if _, derr := s.m.Delete(r.Context(), &warrenv1.DeleteRequest{Id: snap.GetId()}); derr != nil {
			s.log.Warn("delete the copy of a failed snapshot", "id", snap.GetId(), "err", derr)
		}
		s.fail(w, err)
		return
	}
	snap = h.GetSandbox()
	if name != "" {
		// The name now means this snapshot: E2B moves a name to its
		// newest build. The older ones of that name go.
		l, err := s.m.List(r.Context(), &warrenv1.ListRequest{Labels: map[string]string{snapshotLabel: "true", snapshotNameLabel: name}})
		if err == nil {
			for _, o := range l.GetSandboxes() {
				if o.GetId() != snap.GetId() {
					if _, derr := s.m.Delete(r.Context(), &warrenv1.DeleteRequest{Id: o.GetId()}); derr != nil {
						s.log.Warn("delete a snapshot of a reused name", "id", o.GetId(), "err", derr)
					}
				}
			}
		}
	}
	writeJSON(w, http.StatusCreated, toSnapshotInfo(snap))
}

// listSnapshots is GET /snapshots (sandboxID, name, limit, nextToken;
// X-Next-Token): oldest first by id, the token the last id of a page.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := defaultLimit
	if l := q.Get("limit"); l != "" {
		var err error
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > maxLimit {
			s.fail(w, errdefs.Invalidf("limit %q: want 1 to %d", l, maxLimit))
			return
		}
	}
	labels := map[string]string{snapshotLabel: "true"}
	if n := q.Get("name"); n != "" {
		labels[snapshotNameLabel] = strings.TrimPrefix(n, snapshotPrefix)
	}
	l, err := s.m.List(r.Context(), &warrenv1.ListRequest{Labels: labels})
	if err != nil {
		s.fail(w, err)
		return
	}
	var snaps []*warrenv1.Sandbox
	for _, sb := range l.GetSandboxes() {
		if from := q.Get("sandboxID"); from != "" && sb.GetForkedFrom() != from {
			continue
		}
		if after := strings.TrimPrefix(q.Get("nextToken"), snapshotPrefix); after != "" && sb.GetId() <= after {
			continue
		}
		snaps = append(snaps, sb)
	}
	slices.SortFunc(snaps, func(a, b *warrenv1.Sandbox) int { return strings.Compare(a.GetId(), b.GetId()) })
	if len(snaps) > limit {
		snaps = snaps[:limit]
		w.Header().Set("X-Next-Token", snaps[limit-1].GetId())
	}
	out := make([]snapshotInfo, 0, len(snaps))
	for _, sb := range snaps {
		out = append(out, toSnapshotInfo(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is DELETE /templates/{id}: what the SDKs' delete_snapshot
// calls (204, 404 for no such snapshot). Templates that are not
// snapshots are Warren images, not deleted through E2B (501).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("id")
	if !strings.HasPrefix(ref, snapshotPrefix) {
		writeError(w, http.StatusNotImplemented, "templates are Warren images: `warren image rm` (docs/E2B.md)")
		return
	}
	snap, err := s.findSnapshot(r, ref)
	if err == nil {
		_, err = s.m.Delete(r.Context(), &warrenv1.DeleteRequest{Id: snap.GetId()})
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// createFromSnapshot is POST /sandboxes with a snapshot for template: a
// fork of the snapshot, whose labels become exactly the metadata given
// and whose network the one asked for.
func (s *Server) createFromSnapshot(w http.ResponseWriter, r *http.Request, body newSandbox, pol *warrenv1.NetworkPolicy) {
	if len(body.EnvVars) > 0 {
		s.fail(w, errdefs.Unsupportedf("envVars cannot be set on a sandbox made from a snapshot: it has the environment of the snapshot's sandbox"))
		return
	}
	snap, err := s.findSnapshot(r, body.TemplateID)
	if err != nil {
		s.fail(w, err)
		return
	}
	var timeout int64
	if body.Timeout != nil {
		timeout = *body.Timeout
	}
	res, err := s.m.Fork(r.Context(), &warrenv1.ForkRequest{Id: snap.GetId(), Count: 1, TimeoutSeconds: timeout, Labels: body.Metadata})
	if err != nil {
		s.fail(w, err)
		return
	}
	sb := res.GetSandboxes()[0]
	up := &warrenv1.UpdateSandboxRequest{Id: sb.GetId()}
	for k := range sb.GetLabels() {
		if _, ok := body.Metadata[k]; !ok {
			up.RemoveLabels = append(up.RemoveLabels, k)
		}
	}
	if pol != nil && pol.GetMode() != sb.GetNetwork().GetMode() || pol.GetMode() == "allowlist" {
		up.Network = pol
	}
	if sb, err = s.m.UpdateSandbox(r.Context(), up); err != nil {
		if _, derr := s.m.Delete(r.Context(), &warrenv1.DeleteRequest{Id: res.GetSandboxes()[0].GetId()}); derr != nil {
			s.log.Warn("delete a sandbox made from a snapshot", "id", res.GetSandboxes()[0].GetId(), "err", derr)
		}
		s.fail(w, err)
		return
	}
	out := s.created(sb)
	out.TemplateID = body.TemplateID
	writeJSON(w, http.StatusCreated, out)
}
