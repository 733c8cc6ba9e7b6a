package errdefs

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
)

func TestCategories(t *testing.T) {
	err := New(Invalid, "bad tar: %w", io.EOF)
	if got := err.Error(); got != "bad tar: EOF" {
		t.Fatalf("Error() = %q", got)
	}
	if !errors.Is(err, io.EOF) || !errors.Is(err, ErrInvalid) || errors.Is(err, ErrNotFound) {
		t.Fatal("errors.Is does not see the category or the cause")
	}
	wrapped := fmt.Errorf("create: %w", Wrap(NotFound, io.EOF, "open image"))
	if CategoryOf(wrapped) != NotFound || wrapped.Error() != "create: open image: EOF" {
		t.Fatalf("wrapped: %v %v", CategoryOf(wrapped), wrapped)
	}
	if CategoryOf(io.EOF) != Unknown || Wrap(Invalid, nil, "x") != nil {
		t.Fatal("uncategorised or nil errors mishandled")
	}
}

func TestUnsupported(t *testing.T) {
	err := fmt.Errorf("commit: %w", Unsupportedf("backend %s cannot commit", "vm"))
	if CategoryOf(err) != Unsupported || !errors.Is(err, ErrUnsupported) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("category %v", CategoryOf(err))
	}
	if Unsupported.String() != "unsupported" || !slices.Contains(Categories(), Unsupported) {
		t.Fatal("unsupported has no name or is not listed")
	}
}

// TestAlreadyExists pins that "exists already" is carried by the error,
// not by its text: a conflict whose message says "already exists" is not
// one, and wrapping (Wrap, New with %w, fmt.Errorf) keeps the flag.
func TestAlreadyExists(t *testing.T) {
	dup := AlreadyExistsf("sandbox %s is taken", "x")
	if CategoryOf(dup) != Conflict || !IsAlreadyExists(dup) || !errors.Is(dup, ErrConflict) {
		t.Fatal("AlreadyExistsf is not an already-exists conflict")
	}
	if IsAlreadyExists(Conflictf("sandbox x already exists")) {
		t.Fatal("the message decided")
	}
	for _, e := range []error{
		fmt.Errorf("create: %w", dup),
		Wrap(Conflict, dup, "create"),
		New(CategoryOf(dup), "create: %w", dup),
	} {
		if !IsAlreadyExists(e) || CategoryOf(e) != Conflict {
			t.Fatalf("%v lost the flag", e)
		}
	}
	if IsAlreadyExists(Wrap(Internal, dup, "x")) || IsAlreadyExists(New(Invalid, "x: %w", dup)) {
		t.Fatal("an outer category other than Conflict still says already exists")
	}
}
