// Package errdefs defines the error categories every Warren component uses.
// A category travels with an error through %w wrapping and decides the API
// status code, so callers can tell "you asked for something that does not
// exist" from "the node is full" without parsing messages.
package errdefs

import (
	"errors"
	"fmt"
)

// Category is a class of failure that maps to one API status code.
type Category int

const (
	Unknown          Category = iota
	NotFound                  // the named object does not exist
	Invalid                   // the request is malformed or out of range
	Exhausted                 // a limit or resource ran out (disk, memory, quota, output)
	Conflict                  // the object exists, or is in the wrong state
	Unavailable               // transient; retrying later may succeed
	DeadlineExceeded          // the operation ran out of time
	Unauthenticated           // missing or bad credentials
	PermissionDenied          // the caller is known but may not do this (a path Warren never touches, a policy)
	Internal                  // a bug or an unexpected host failure
	// Unsupported: the backend or store cannot do this call at all (a
	// backend without commits, files or live updates). Unlike Unavailable
	// it is permanent for this node, so clients never retry it.
	Unsupported
)

var names = map[Category]string{
	Unknown: "unknown", NotFound: "not_found", Invalid: "invalid", Exhausted: "exhausted",
	Conflict: "conflict", Unavailable: "unavailable", DeadlineExceeded: "deadline_exceeded",
	Unauthenticated: "unauthenticated", PermissionDenied: "permission_denied", Internal: "internal",
	Unsupported: "unsupported",
}

func (c Category) String() string { return names[c] }

// Categories lists every category, for metrics initialisation.
func Categories() []Category {
	return []Category{Unknown, NotFound, Invalid, Exhausted, Conflict, Unavailable, DeadlineExceeded, Unauthenticated, PermissionDenied, Internal, Unsupported}
}

// sentinel errors so that errors.Is works on categories.
var (
	ErrNotFound         = &catErr{cat: NotFound}
	ErrInvalid          = &catErr{cat: Invalid}
	ErrExhausted        = &catErr{cat: Exhausted}
	ErrConflict         = &catErr{cat: Conflict}
	ErrUnavailable      = &catErr{cat: Unavailable}
	ErrDeadlineExceeded = &catErr{cat: DeadlineExceeded}
	ErrUnauthenticated  = &catErr{cat: Unauthenticated}
	ErrPermissionDenied = &catErr{cat: PermissionDenied}
	ErrInternal         = &catErr{cat: Internal}
	ErrUnsupported      = &catErr{cat: Unsupported}
)

type catErr struct {
	cat Category
	msg string
	err error
	// whole is set when msg already includes err's text (New with %w).
	whole bool
	// exists refines Conflict: the object exists already (a duplicate
	// id or name), which the API reports as AlreadyExists rather than
	// FailedPrecondition. It is a flag, not a category of its own, so
	// that the category header and metrics still say "conflict".
	exists bool
}

func (e *catErr) Error() string {
	switch {
	case e.whole:
		return e.msg
	case e.msg != "" && e.err != nil:
		return e.msg + ": " + e.err.Error()
	case e.msg != "":
		return e.msg
	case e.err != nil:
		return e.err.Error()
	}
	return e.cat.String()
}

func (e *catErr) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrNotFound) true for any error of that category.
func (e *catErr) Is(target error) bool {
	t, ok := target.(*catErr)
	return ok && t.msg == "" && t.err == nil && t.cat == e.cat
}

// New returns an error of category c with a formatted message. %w verbs
// wrap; a Conflict wrapping an already-exists conflict stays one.
func New(c Category, format string, args ...any) error {
	wrapped := fmt.Errorf(format, args...)
	inner := errors.Unwrap(wrapped)
	return &catErr{cat: c, msg: wrapped.Error(), err: inner, whole: true, exists: c == Conflict && IsAlreadyExists(inner)}
}

// Wrap attaches category c to err with a message; nil stays nil. A
// Conflict wrapping an already-exists conflict stays one.
func Wrap(c Category, err error, msg string) error {
	if err == nil {
		return nil
	}
	return &catErr{cat: c, msg: msg, err: err, exists: c == Conflict && IsAlreadyExists(err)}
}

// AlreadyExistsf returns a Conflict that says the object exists already
// (a duplicate sandbox id, an exclusive create of a path that is there).
func AlreadyExistsf(format string, args ...any) error {
	e := New(Conflict, format, args...).(*catErr)
	e.exists = true
	return e
}

// IsAlreadyExists reports whether err's category is Conflict because the
// object exists already (AlreadyExistsf). The outermost category decides,
// as in CategoryOf.
func IsAlreadyExists(err error) bool {
	var ce *catErr
	return errors.As(err, &ce) && ce.cat == Conflict && ce.exists
}

// CategoryOf returns the outermost category in err's chain, Unknown if none.
func CategoryOf(err error) Category {
	var ce *catErr
	if errors.As(err, &ce) {
		return ce.cat
	}
	return Unknown
}

func NotFoundf(format string, args ...any) error    { return New(NotFound, format, args...) }
func Invalidf(format string, args ...any) error     { return New(Invalid, format, args...) }
func Exhaustedf(format string, args ...any) error   { return New(Exhausted, format, args...) }
func Conflictf(format string, args ...any) error    { return New(Conflict, format, args...) }
func Unavailablef(format string, args ...any) error { return New(Unavailable, format, args...) }
func PermissionDeniedf(format string, args ...any) error {
	return New(PermissionDenied, format, args...)
}
func Internalf(format string, args ...any) error { return New(Internal, format, args...) }
func Unsupportedf(format string, args ...any) error {
	return New(Unsupported, format, args...)
}
