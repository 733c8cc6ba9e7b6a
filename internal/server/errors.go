package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"connectrpc.com/connect"

	"github.com/warrenrl/warren/internal/errdefs"
)

// CategoryHeader is the response metadata key (an HTTP header, or a gRPC
// trailer) that carries the errdefs category name of a failed call, so
// clients can tell categories apart that share a status code.
const CategoryHeader = "Warren-Error-Category"

// categoryCode maps an error's category to its connect code. A conflict
// is AlreadyExists when the error says so by its kind
// (errdefs.AlreadyExistsf), never by its text.
func categoryCode(err error) connect.Code {
	cat := errdefs.CategoryOf(err)
	switch cat {
	case errdefs.NotFound:
		return connect.CodeNotFound
	case errdefs.Invalid:
		return connect.CodeInvalidArgument
	case errdefs.Exhausted:
		return connect.CodeResourceExhausted
	case errdefs.Conflict:
		if errdefs.IsAlreadyExists(err) {
			return connect.CodeAlreadyExists
		}
		return connect.CodeFailedPrecondition
	case errdefs.Unavailable:
		return connect.CodeUnavailable
	case errdefs.DeadlineExceeded:
		return connect.CodeDeadlineExceeded
	case errdefs.Unauthenticated:
		return connect.CodeUnauthenticated
	case errdefs.PermissionDenied:
		return connect.CodePermissionDenied
	case errdefs.Unsupported:
		return connect.CodeUnimplemented
	}
	return connect.CodeInternal
}

// classify returns the category and connect code for err. Errors without a
// category are internal, except context errors, which keep their meaning.
func classify(err error) (errdefs.Category, connect.Code) {
	cat := errdefs.CategoryOf(err)
	if cat == errdefs.Unknown {
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return errdefs.DeadlineExceeded, connect.CodeDeadlineExceeded
		case errors.Is(err, context.Canceled):
			return errdefs.Unknown, connect.CodeCanceled
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.Exhausted, connect.CodeResourceExhausted
		}
		return errdefs.Internal, connect.CodeInternal
	}
	return cat, categoryCode(err)
}

// ToConnectError converts a Manager error into a *connect.Error whose code
// follows the error's category and whose metadata carries the category name.
// Errors that already are connect errors pass through; nil stays nil.
func ToConnectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		if ce.Meta().Get(CategoryHeader) == "" {
			ce.Meta().Set(CategoryHeader, codeCategory(ce.Code()).String())
		}
		return ce
	}
	cat, code := classify(err)
	ce = connect.NewError(code, err)
	ce.Meta().Set(CategoryHeader, cat.String())
	return ce
}

// codeCategory is the reverse mapping, for errors raised by connect itself
// (for example a message over the size limit). The client package has its
// own copy for answers without a category (it cannot import internal/);
// it differs on purpose for codes neither places: Unknown there, Internal
// here.
func codeCategory(code connect.Code) errdefs.Category {
	switch code {
	case connect.CodeNotFound:
		return errdefs.NotFound
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return errdefs.Invalid
	case connect.CodeResourceExhausted:
		return errdefs.Exhausted
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodeAborted:
		return errdefs.Conflict
	case connect.CodeUnavailable:
		return errdefs.Unavailable
	case connect.CodeDeadlineExceeded:
		return errdefs.DeadlineExceeded
	case connect.CodeUnauthenticated:
		return errdefs.Unauthenticated
	case connect.CodePermissionDenied:
		return errdefs.PermissionDenied
	case connect.CodeUnimplemented:
		return errdefs.Unsupported
	case connect.CodeCanceled:
		return errdefs.Unknown
	}
	return errdefs.Internal
}

// httpStatus maps a connect code to the HTTP status of the plain HTTP
// endpoints. Conflicts use 409, which reads better than connect's 400.
func httpStatus(code connect.Code) int {
	switch code {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeCanceled:
		return 499 // client closed request
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// JSONError is the body of a failed plain HTTP request. Code and Message
// follow the Connect protocol's error JSON; Category is the errdefs name.
type JSONError struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	Category string `json:"category,omitempty"`
}

// writeHTTPError writes err as a JSON error with the matching HTTP status.
func writeHTTPError(w http.ResponseWriter, err error) {
	cat, code := classify(err)
	var ce *connect.Error
	msg := err.Error()
	if errors.As(err, &ce) {
		code, cat, msg = ce.Code(), codeCategory(ce.Code()), ce.Message()
	}
	writeJSONError(w, httpStatus(code), JSONError{Code: code.String(), Message: msg, Category: cat.String()})
}

func writeJSONError(w http.ResponseWriter, status int, e JSONError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	if e.Category != "" {
		h.Set(CategoryHeader, e.Category)
	}
	h.Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

// CategoryOf is err's category for a caller of a Manager that may be a
// cluster gateway, whose errors are the nodes' answers (*connect.Error
// with the category in CategoryHeader): errdefs' category where err has
// one, else the category the connect error carries (or its code's).
func CategoryOf(err error) errdefs.Category {
	if c := errdefs.CategoryOf(err); c != errdefs.Unknown {
		return c
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return errdefs.Unknown
	}
	if name := ce.Meta().Get(CategoryHeader); name != "" {
		for _, c := range errdefs.Categories() {
			if c.String() == name {
				return c
			}
		}
	}
	if ce.Code() == connect.CodeCanceled {
		return errdefs.Unknown
	}
	return codeCategory(ce.Code())
}
