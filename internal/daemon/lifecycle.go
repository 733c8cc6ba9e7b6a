package daemon

import (
	"fmt"
	"slices"
	"strings"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/metrics"
)

// state is a sandbox's lifecycle state: the wire enum, plus stateGone.
// The sandbox's state alone answers "may I do X now" (allowLocked); the
// channels on the sandbox (ready, deleting) only carry the waiting.
//
//	            create ok              init exits
//	CREATING ───────────► RUNNING ─────────────────► STOPPED
//	   │                  ▲  │  ▲  ╲ pause            ▲ │
//	   │ create fails     │  │  │   ╲   hibernate     │ │
//	   ▼                  │  │  │    ▼                │ │ init exits
//	 gone     adopt ok    │  │  └─ PAUSED, HIBERNATED ┘ │
//	          (retried)   │  │ resume  │                │
//	 LOST ────────────────┘  │ delete  │ delete         │ delete
//	 (adopt failed, not      ▼         ▼                ▼
//	  proven gone) ─────► DELETING ──────────────────► gone
//	                         │  destroy failed: back to the state before,
//	                         └─ or STOPPED if the init exited meanwhile
//
// A LOST sandbox whose record says it was paused goes back to PAUSED
// once adopted. PAUSED is persisted before the freeze and RUNNING after
// the thaw, so that a crash in between leaves a record that Resume
// fixes (thawing a sandbox that runs does nothing).
//
// Transitions are listed in transitions; calls per state in allowed.
// Get, List and reads of processes work in every state but gone. A
// record in a state this daemon does not know (a number from a newer
// daemon) keeps that number: it is listed, its resources are kept, it
// has no timer, and Delete is the one call it allows.
//
// LOST is never written to the store: its record stays RUNNING, so that
// the next daemon tries to adopt it again.
type state = warrenv1.SandboxState

const (
	stateCreating   = warrenv1.SandboxState_SANDBOX_STATE_CREATING
	stateRunning    = warrenv1.SandboxState_SANDBOX_STATE_RUNNING
	statePaused     = warrenv1.SandboxState_SANDBOX_STATE_PAUSED
	stateHibernated = warrenv1.SandboxState_SANDBOX_STATE_HIBERNATED
	stateStopped    = warrenv1.SandboxState_SANDBOX_STATE_STOPPED
	stateLost       = warrenv1.SandboxState_SANDBOX_STATE_LOST
	stateDeleting   = warrenv1.SandboxState_SANDBOX_STATE_DELETING
	// stateGone: deleted, or its creation rolled back. It is out of the
	// manager's map; every call gets NotFound. Never on the wire.
	stateGone state = -1
)

// op is a class of call the lifecycle table permits or refuses.
type op uint8

const (
	opInspect   op = iota // Get, List, ListProcesses, WaitProcess, SignalProcess, WriteStdin
	opExec                // Exec, ExecStream, StartProcess
	opFiles               // file calls and archives
	opCommit              // CommitSandbox
	opUpdate              // UpdateSandbox
	opExtend              // ExtendTimeout
	opDelete              // Delete and expiry (CREATING and DELETING wait instead)
	opPause               // Pause
	opResume              // Resume (a thaw, or a restore from HIBERNATED)
	opHibernate           // Hibernate
	opFork                // Fork (of a HIBERNATED sandbox; others are hibernated first)
	// opProcess: SignalProcess, WriteStdin, ResizeProcess, which reach
	// the sandbox's agent: refused while it is frozen (they would block
	// until it is resumed), as in states this daemon does not know.
	opProcess
	opPort // DialPort: a connection to a server in the sandbox
)

var opNames = [...]string{
	opInspect: "inspect", opExec: "exec", opFiles: "file access", opCommit: "commit",
	opUpdate: "update", opExtend: "extend timeout", opDelete: "delete",
	opPause: "pause", opResume: "resume", opProcess: "signal, stdin or resize of a process",
	opHibernate: "hibernate", opFork: "fork", opPort: "a connection to a port",
}

func (o op) String() string { return opNames[o] }

// known are the states of this daemon's table, in the order messages
// list them.
var known = []state{stateCreating, stateRunning, statePaused, stateHibernated, stateStopped, stateLost, stateDeleting}

// allowed are the calls each known state permits besides opInspect.
var allowed = map[state][]op{
	stateCreating:   {opProcess}, // Delete waits for the creation to finish
	stateRunning:    {opExec, opFiles, opCommit, opUpdate, opExtend, opDelete, opPause, opProcess, opHibernate, opPort},
	statePaused:     {opExtend, opDelete, opResume, opHibernate},
	stateHibernated: {opExtend, opDelete, opResume, opFork},
	stateStopped:    {opExtend, opDelete, opProcess},
	stateLost:       {opExtend, opDelete, opProcess},
	stateDeleting:   {opProcess}, // Delete waits for the deletion in progress
}

// allowedUnknown are the calls a state this daemon does not know permits.
var allowedUnknown = []op{opDelete}

// transitions are the state changes the daemon makes; any other is a bug
// (setState refuses it). stateGone has none: it is final.
var transitions = map[state][]state{
	stateCreating:   {stateRunning, stateGone},
	stateRunning:    {statePaused, stateHibernated, stateStopped, stateLost, stateDeleting},
	statePaused:     {stateRunning, stateHibernated, stateStopped, stateDeleting},
	stateHibernated: {stateRunning, stateDeleting},
	stateStopped:    {stateDeleting},
	stateLost:       {stateRunning, statePaused, stateStopped, stateDeleting},
	// Back to the state before when Destroy fails (STOPPED when the init
	// died meanwhile); unknown states go back too (canTransition).
	stateDeleting: {stateGone, stateRunning, statePaused, stateHibernated, stateStopped, stateLost},
}

func isKnown(st state) bool { return slices.Contains(known, st) }

// canTransition reports whether the table has from -> to.
func canTransition(from, to state) bool {
	if from == stateGone {
		return false
	}
	if !isKnown(from) {
		return to == stateDeleting
	}
	if from == stateDeleting && !isKnown(to) && to != stateGone {
		return true // a failed delete of an unknown record
	}
	return slices.Contains(transitions[from], to)
}

// permits reports whether state st allows o.
func permits(st state, o op) bool {
	switch {
	case st == stateGone:
		return false
	case o == opInspect:
		return true
	case !isKnown(st):
		return slices.Contains(allowedUnknown, o)
	}
	return slices.Contains(allowed[st], o)
}

// needs lists the states that allow o, for messages: "RUNNING", "RUNNING,
// PAUSED or STOPPED".
func needs(o op) string {
	var names []string
	for _, st := range known {
		if permits(st, o) {
			names = append(names, stateName(st))
		}
	}
	switch len(names) {
	case 0:
		return "no state"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// stateName is the state as users see it: "RUNNING", or "state 9" for a
// number this daemon does not know.
func stateName(st state) string {
	if st == stateGone {
		return "GONE"
	}
	if isKnown(st) {
		return strings.TrimPrefix(st.String(), "SANDBOX_STATE_")
	}
	return fmt.Sprintf("state %d", int32(st))
}

// allowLocked is the one check of every call: nil when the sandbox's
// state permits o, else NotFound (gone) or Conflict naming the state and
// what o needs ("sandbox x is PAUSED: exec needs RUNNING"); s.mu held.
func (s *sandbox) allowLocked(o op) error {
	st := s.st
	if permits(st, o) {
		return nil
	}
	if st == stateGone {
		return errdefs.NotFoundf("sandbox %s not found", s.id)
	}
	why := ""
	switch {
	case st == stateStopped && s.info.GetDeadReason() != "":
		why = " (" + s.info.GetDeadReason() + ")"
	case st == stateLost:
		why = " (the node cannot reach it now; it is retried)"
	case st == statePaused:
		why = " (its processes are frozen: Resume it first)"
	case !isKnown(st):
		why = ", which this daemon does not know (a newer daemon's?)"
	}
	return errdefs.Conflictf("sandbox %s is %s%s: %s needs %s", s.id, stateName(st), why, o, needs(o))
}

// setState moves the sandbox to st and keeps the gauges and the reported
// state in step; s.mu held. A move the table does not have is refused
// (Internal), which tests catch: it is a bug of the daemon.
func (m *Manager) setState(s *sandbox, st state) error {
	if !canTransition(s.st, st) {
		err := errdefs.Internalf("sandbox %s: no transition %s -> %s", s.id, stateName(s.st), stateName(st))
		m.log.Error("lifecycle", "err", err)
		return err
	}
	m.metrics.SandboxState(stateLabel(s.st), stateLabel(st))
	if s.st == stateRunning && st != stateRunning {
		s.endWatchesLocked(st)
	}
	s.st = st
	if st != stateGone {
		s.info.State = st
	}
	return nil
}

// stateLabel is st's value of the warren_sandboxes{state} label.
func stateLabel(st state) string {
	switch st {
	case stateGone:
		return ""
	case stateCreating:
		return metrics.StateCreating
	case stateRunning:
		return metrics.StateRunning
	case statePaused:
		return metrics.StatePaused
	case stateHibernated:
		return metrics.StateHibernated
	case stateStopped:
		return metrics.StateStopped
	case stateLost:
		return metrics.StateLost
	case stateDeleting:
		return metrics.StateDeleting
	}
	return metrics.StateUnknown
}

// servedHere reports whether this daemon drives a record of state st on
// adoption: RUNNING and PAUSED ones are adopted, STOPPED ones kept,
// CREATING and DELETING ones finished. The others (HIBERNATED, which only
// a newer daemon makes so far, and unknown numbers) keep their resources
// untouched until a Delete.
func servedHere(st state) bool {
	return st == stateRunning || st == statePaused || st == stateHibernated || st == stateStopped || st == stateCreating || st == stateDeleting
}
