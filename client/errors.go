package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"

	"connectrpc.com/connect"
)

// Category classifies a failure. The names are those of the daemon's error
// categories (internal/errdefs).
//
// This package is public and its API names no internal/ type, so the names
// and CategoryHeader are spelled again here: internal/server's
// TestClientCategoriesMatch checks that they agree with the daemon's.
// (DownloadTo uses internal/untrusted and internal/errdefs underneath.)
type Category string

const (
	CategoryUnknown          Category = "unknown"
	CategoryNotFound         Category = "not_found"
	CategoryInvalid          Category = "invalid"
	CategoryExhausted        Category = "exhausted"
	CategoryConflict         Category = "conflict"
	CategoryUnavailable      Category = "unavailable"
	CategoryDeadlineExceeded Category = "deadline_exceeded"
	CategoryUnauthenticated  Category = "unauthenticated"
	CategoryPermissionDenied Category = "permission_denied"
	CategoryInternal         Category = "internal"
	// CategoryUnsupported: the node's backend cannot do the call at all
	// (for example commit on a backend without a host-visible upper
	// layer). Permanent for that node: do not retry.
	CategoryUnsupported Category = "unsupported"
)

// CategoryHeader is the response metadata key carrying the category.
const CategoryHeader = "Warren-Error-Category"

// Error is the error every Client method returns for a failed call.
type Error struct {
	Category Category
	Code     connect.Code // the RPC status code
	Message  string
	err      error
}

func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Category)
	}
	return string(e.Category) + ": " + e.Message
}

// Unwrap returns the underlying transport error, so that errors.Is with
// context.Canceled or context.DeadlineExceeded works.
func (e *Error) Unwrap() error { return e.err }

// CategoryOf returns the category of err: that of an *Error in its chain,
// CategoryUnknown otherwise (and for nil).
func CategoryOf(err error) Category {
	var e *Error
	if errors.As(err, &e) {
		return e.Category
	}
	return CategoryUnknown
}

func IsNotFound(err error) bool         { return CategoryOf(err) == CategoryNotFound }
func IsInvalid(err error) bool          { return CategoryOf(err) == CategoryInvalid }
func IsExhausted(err error) bool        { return CategoryOf(err) == CategoryExhausted }
func IsConflict(err error) bool         { return CategoryOf(err) == CategoryConflict }
func IsUnavailable(err error) bool      { return CategoryOf(err) == CategoryUnavailable }
func IsDeadlineExceeded(err error) bool { return CategoryOf(err) == CategoryDeadlineExceeded }
func IsUnauthenticated(err error) bool  { return CategoryOf(err) == CategoryUnauthenticated }
func IsPermissionDenied(err error) bool { return CategoryOf(err) == CategoryPermissionDenied }
func IsInternal(err error) bool         { return CategoryOf(err) == CategoryInternal }
func IsUnsupported(err error) bool      { return CategoryOf(err) == CategoryUnsupported }

// IsAlreadyExists reports a conflict because the object exists already
// (for example a duplicate sandbox id or image name).
func IsAlreadyExists(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == connect.CodeAlreadyExists
}

// codeCategory is the category of a code when the server did not say. It
// follows the server's codeCategory (internal/server) but leaves codes it
// cannot place Unknown, where the server says Internal.
func codeCategory(code connect.Code) Category {
	switch code {
	case connect.CodeNotFound:
		return CategoryNotFound
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return CategoryInvalid
	case connect.CodeResourceExhausted:
		return CategoryExhausted
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodeAborted:
		return CategoryConflict
	case connect.CodeUnavailable:
		return CategoryUnavailable
	case connect.CodeDeadlineExceeded:
		return CategoryDeadlineExceeded
	case connect.CodeUnauthenticated:
		return CategoryUnauthenticated
	case connect.CodePermissionDenied:
		return CategoryPermissionDenied
	case connect.CodeUnimplemented:
		return CategoryUnsupported
	case connect.CodeInternal, connect.CodeDataLoss:
		return CategoryInternal
	}
	return CategoryUnknown
}

// wrapErr turns an error of the connect client into an *Error.
func wrapErr(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		ce = connect.NewError(connect.CodeOf(err), err)
	}
	code := ce.Code()
	// A connection the daemon reset or closed mid-call (it was killed or
	// restarted) is connect's "canceled" (it takes a reset for its own
	// caller going away) or "unknown"; it is unavailable, like the EOF and
	// the refused dial of the same restart, so callers retry it.
	if (code == connect.CodeUnknown || code == connect.CodeCanceled) && !errors.Is(err, context.Canceled) &&
		(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		code = connect.CodeUnavailable
	}
	cat := Category(ce.Meta().Get(CategoryHeader))
	// So is a response cut short ("internal: protocol error: incomplete
	// envelope"), when the daemon did not say internal itself.
	if code == connect.CodeInternal && cat == "" && errors.Is(err, io.ErrUnexpectedEOF) {
		code = connect.CodeUnavailable
	}
	if cat == "" {
		cat = codeCategory(code)
	}
	return &Error{Category: cat, Code: code, Message: ce.Message(), err: err}
}

// httpCode maps the status of a plain HTTP endpoint to a code when the body
// carries none.
func httpCode(status int) connect.Code {
	switch status {
	case http.StatusBadRequest:
		return connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		return connect.CodeUnauthenticated
	case http.StatusForbidden:
		return connect.CodePermissionDenied
	case http.StatusNotFound:
		return connect.CodeNotFound
	case http.StatusConflict:
		return connect.CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge, http.StatusTooManyRequests:
		return connect.CodeResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return connect.CodeUnavailable
	case http.StatusGatewayTimeout:
		return connect.CodeDeadlineExceeded
	case http.StatusNotImplemented:
		return connect.CodeUnimplemented
	}
	return connect.CodeUnknown
}

// httpError reads the JSON error body of a failed plain HTTP response.
func httpError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var j struct {
		Code     string `json:"code"`
		Message  string `json:"message"`
		Category string `json:"category"`
	}
	code := httpCode(resp.StatusCode)
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &j) == nil && (j.Code != "" || j.Message != "") {
		msg = j.Message
		var c connect.Code
		if c.UnmarshalText([]byte(j.Code)) == nil {
			code = c
		}
	}
	if msg == "" {
		msg = resp.Status
	}
	cat := Category(j.Category)
	if cat == "" {
		cat = Category(resp.Header.Get(CategoryHeader))
	}
	if cat == "" {
		cat = codeCategory(code)
	}
	return &Error{Category: cat, Code: code, Message: msg, err: fmt.Errorf("HTTP %s", resp.Status)}
}

// transportError wraps a failure to reach the daemon on a plain HTTP call.
func transportError(err error) error {
	code := connect.CodeUnavailable
	switch {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	}
	return wrapErr(connect.NewError(code, err))
}
