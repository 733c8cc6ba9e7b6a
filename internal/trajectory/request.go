package trajectory

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

// Methods, as TrajectoryEntry.method names them.
const (
	MethodExec       = "exec"
	MethodWriteFile  = "write_file"
	MethodMakeDir    = "make_dir"
	MethodRemoveFile = "remove_file"
	MethodUpload     = "upload"
)

// unhashed are the fields that address a call rather than say what it
// does: they are left out of the canonical request.
var unhashed = map[protoreflect.Name]bool{
	"sandbox_id": true, "session_id": true, "seq": true, "idempotency_key": true,
}

// payloadField is the bytes field of each request kept out of the log
// entry (its digest and length stand for it).
var payloadField = map[string]protoreflect.Name{
	MethodExec:      "stdin",
	MethodWriteFile: "content",
}

// RequestHash is the canonical hash of a request: SHA-256 over the method
// and the request's deterministic protobuf encoding without the fields
// that address it (sandbox, session, seq, idempotency key).
func RequestHash(method string, req proto.Message) string {
	c := proto.Clone(req)
	clearFields(c, unhashed)
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// UploadLate is the request hash and payload digest of an upload to path
// of a tar of n bytes whose SHA-256 is bodySum.
func UploadLate(path string, n int64, bodySum []byte) *Late {
	sum := hex.EncodeToString(bodySum)
	return &Late{
		Hash:          RequestHash(MethodUpload, &warrenv1.TrajectoryEntry{PayloadSha256: sum, Request: &warrenv1.TrajectoryEntry_Upload{Upload: &warrenv1.TrajectoryUpload{Path: path}}}),
		PayloadBytes:  n,
		PayloadSha256: sum,
	}
}

func clearFields(m proto.Message, names map[protoreflect.Name]bool) {
	r := m.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		if f := fields.Get(i); names[f.Name()] {
			r.Clear(f)
		}
	}
}

// NewEntry builds the request part of an entry: the request without its
// payload, which payload_bytes and payload_sha256 stand for.
func NewEntry(method string, req proto.Message) *warrenv1.TrajectoryEntry {
	e := &warrenv1.TrajectoryEntry{Method: method}
	c := proto.Clone(req)
	if name, ok := payloadField[method]; ok {
		r := c.ProtoReflect()
		f := r.Descriptor().Fields().ByName(name)
		payload := r.Get(f).Bytes()
		if len(payload) > 0 {
			sum := sha256.Sum256(payload)
			e.PayloadBytes, e.PayloadSha256 = int64(len(payload)), hex.EncodeToString(sum[:])
		}
		r.Clear(f)
	}
	switch r := c.(type) {
	case *warrenv1.ExecRequest:
		e.Request = &warrenv1.TrajectoryEntry_Exec{Exec: r}
	case *warrenv1.WriteFileRequest:
		e.Request = &warrenv1.TrajectoryEntry_WriteFile{WriteFile: r}
	case *warrenv1.MakeDirRequest:
		e.Request = &warrenv1.TrajectoryEntry_MakeDir{MakeDir: r}
	case *warrenv1.RemoveFileRequest:
		e.Request = &warrenv1.TrajectoryEntry_RemoveFile{RemoveFile: r}
	case *warrenv1.TrajectoryUpload:
		e.Request = &warrenv1.TrajectoryEntry_Upload{Upload: r}
	}
	return e
}

// Diff says how the request of entry b differs from the recorded entry a,
// field by field, for the mismatch error.
func Diff(a, b *warrenv1.TrajectoryEntry) string {
	if a.GetMethod() != b.GetMethod() {
		return fmt.Sprintf("recorded %s %s, got %s %s", a.GetMethod(), Summary(a), b.GetMethod(), Summary(b))
	}
	var diffs []string
	ra, rb := requestOf(a).ProtoReflect(), requestOf(b).ProtoReflect()
	fields := ra.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		if unhashed[f.Name()] {
			continue
		}
		va, vb := ra.Get(f), rb.Get(f)
		if !va.Equal(vb) {
			diffs = append(diffs, fmt.Sprintf("%s: recorded %s, got %s", f.Name(), short(va), short(vb)))
		}
	}
	if a.GetPayloadSha256() != b.GetPayloadSha256() {
		diffs = append(diffs, fmt.Sprintf("payload: recorded %d bytes (sha256 %.12s), got %d bytes (sha256 %.12s)",
			a.GetPayloadBytes(), a.GetPayloadSha256(), b.GetPayloadBytes(), b.GetPayloadSha256()))
	}
	if len(diffs) == 0 {
		return "the requests differ" // a field this daemon does not know
	}
	return strings.Join(diffs, "; ")
}

func requestOf(e *warrenv1.TrajectoryEntry) proto.Message {
	switch r := e.GetRequest().(type) {
	case *warrenv1.TrajectoryEntry_Exec:
		return r.Exec
	case *warrenv1.TrajectoryEntry_WriteFile:
		return r.WriteFile
	case *warrenv1.TrajectoryEntry_MakeDir:
		return r.MakeDir
	case *warrenv1.TrajectoryEntry_RemoveFile:
		return r.RemoveFile
	case *warrenv1.TrajectoryEntry_Upload:
		return r.Upload
	}
	return &warrenv1.TrajectoryUpload{}
}

// Summary is a one-line human-readable form of an entry's request.
func Summary(e *warrenv1.TrajectoryEntry) string {
	switch r := e.GetRequest().(type) {
	case *warrenv1.TrajectoryEntry_Exec:
		if r.Exec.GetShell() != "" {
			return fmt.Sprintf("%q", r.Exec.GetShell())
		}
		return fmt.Sprintf("%q", r.Exec.GetArgv())
	case *warrenv1.TrajectoryEntry_WriteFile:
		return r.WriteFile.GetPath()
	case *warrenv1.TrajectoryEntry_MakeDir:
		return r.MakeDir.GetPath()
	case *warrenv1.TrajectoryEntry_RemoveFile:
		return r.RemoveFile.GetPath()
	case *warrenv1.TrajectoryEntry_Upload:
		return r.Upload.GetPath()
	}
	return ""
}

func short(v protoreflect.Value) string {
	s := fmt.Sprint(v.Interface())
	switch x := v.Interface().(type) {
	case string:
		s = fmt.Sprintf("%q", x)
	case protoreflect.List:
		parts := make([]string, x.Len())
		for i := range x.Len() {
			parts[i] = fmt.Sprintf("%q", x.Get(i).String())
		}
		s = "[" + strings.Join(parts, " ") + "]"
	case protoreflect.Map:
		var parts []string
		x.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			parts = append(parts, fmt.Sprintf("%s=%q", k.String(), v.String()))
			return true
		})
		s = "{" + strings.Join(parts, " ") + "}"
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

// categoryName is how an entry keeps an error's category; an
// already-exists conflict keeps that refinement.
func categoryName(err error) string {
	if errdefs.IsAlreadyExists(err) {
		return "already_exists"
	}
	return errdefs.CategoryOf(err).String()
}

// Err is the recorded error of an entry (nil for a success), with its
// category.
func Err(e *warrenv1.TrajectoryEntry) error {
	if e.GetErrorCategory() == "" && e.GetError() == "" {
		return nil
	}
	if e.GetErrorCategory() == "already_exists" {
		return errdefs.AlreadyExistsf("%s", e.GetError())
	}
	for _, c := range errdefs.Categories() {
		if c.String() == e.GetErrorCategory() {
			return errdefs.New(c, "%s", e.GetError())
		}
	}
	return errdefs.New(errdefs.Unknown, "%s", e.GetError())
}

// fdatasync syncs f's data. Through the raw conn, so that a Close racing
// it (the sandbox deleted during a call) fails the sync instead of
// closing the descriptor under it.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if !errors.Is(serr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
