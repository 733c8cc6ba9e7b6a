package errdefs

import (
	"errors"
	"fmt"
	"io"
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
