// Package cleanup is a stack of undo functions for half-created resources:
// push an undo after each step succeeds, call Release when the whole
// operation succeeded, and defer Clean so a failure anywhere rolls back
// exactly what was done, in reverse order.
package cleanup

import (
	"errors"
	"fmt"
)

// Cleanup holds undo functions. The zero value is ready to use.
type Cleanup struct {
	fns []func() error
}

// Add pushes an undo function.
func (c *Cleanup) Add(f func() error) { c.fns = append(c.fns, f) }

// AddAs pushes an undo function whose error says what it was undoing
// ("what: err").
func (c *Cleanup) AddAs(what string, f func() error) {
	c.Add(func() error {
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

// Clean runs the undo functions in reverse order and forgets them. It is a
// no-op after Release. It returns the joined errors of the undo functions.
func (c *Cleanup) Clean() error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		if err := c.fns[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.fns = nil
	return errors.Join(errs...)
}

// Release forgets the undo functions: the operation succeeded.
func (c *Cleanup) Release() { c.fns = nil }
