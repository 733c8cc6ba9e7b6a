package backend

import (
	"context"
	"errors"
	"syscall"
	"time"
)

// JobRunner is implemented by sandboxes whose agent runs whole jobs (the
// fncall backend's pooled environments, which are container sandboxes):
// every step of a job in one round trip, then the sandbox's reset.
type JobRunner interface {
	// RunJob runs j's steps in order and resets the sandbox. A program's
	// failure is a step's Status; an error means the sandbox failed (it
	// must not be reused then), as does a JobResult with ResetErr set. An
	// error that wraps ErrJobCut comes after the job reached the sandbox,
	// with the results of the steps that ended before it.
	RunJob(ctx context.Context, j Job) (JobResult, error)
}

// ErrJobCut marks a RunJob error after the job reached the sandbox: it
// ran up to the steps in the JobResult, and the sandbox failed meanwhile
// (its agent died, or broke the protocol).
var ErrJobCut = errors.New("the sandbox failed mid-job")

// Job is one or more steps run in order in one sandbox, as one user.
type Job struct {
	UID, GID uint32
	// Workdir is every step's working directory, emptied (with Wipe)
	// after the job: the job's user owns it.
	Workdir string
	// Wipe are more directories the reset empties: the places outside
	// Workdir that the job's user can write (/tmp, /var/tmp, /dev/shm).
	Wipe  []string
	Steps []Step
}

// Step is one program of a job.
type Step struct {
	Argv []string
	Env  []string
	// Stdin is the program's standard input (empty: /dev/null).
	Stdin []byte
	// Files are written into Workdir before the program starts.
	Files []FileIn
	// Outputs are files of Workdir read back after the program ended.
	Outputs []string
	Limits  StepLimits
	// Continue runs the next step even when this one is not Accepted.
	Continue bool
}

// FileIn is a file a step gets: Data, or the output named From of the
// earlier step FromStep (>= 0).
type FileIn struct {
	Name     string // relative to Workdir
	Mode     uint32 // permission bits; 0 for 0644
	Data     []byte
	FromStep int
	From     string
}

// StepLimits bound one step. A zero field means no limit, except Wall,
// which every step must have.
type StepLimits struct {
	CPU  time.Duration // CPU time of the program and its waited-for children
	Wall time.Duration
	// MemoryBytes bounds the peak resident memory; the sandbox's memory
	// cgroup holds the job to the largest of its steps' limits.
	MemoryBytes   int64
	Procs         uint32 // processes and threads of the job's user
	OutputBytes   int64  // per stream; more is OutputLimit
	FileSizeBytes int64  // the largest file a program may write
	OpenFiles     uint32
	// FileOutBytes bounds each output file read back.
	FileOutBytes int64
	// DiskBytes bounds what the whole job writes: the sandbox that runs
	// it has a writable layer of that size (Spec.DiskBytes). A job takes
	// the largest of its steps'; a step that fills it is OutputLimit.
	DiskBytes int64
}

// Status is how a step ended.
type Status uint32

// The statuses of a step, as the agent reports them.
const (
	StatusAccepted      Status = 1
	StatusNonZeroExit   Status = 2
	StatusSignalled     Status = 3
	StatusTimeLimit     Status = 4
	StatusMemoryLimit   Status = 5
	StatusOutputLimit   Status = 6
	StatusFileError     Status = 7
	StatusInternalError Status = 8
)

var statusNames = [...]string{"", "accepted", "non_zero_exit", "signalled", "time_limit", "memory_limit", "output_limit", "file_error", "internal_error"}

func (s Status) String() string {
	if int(s) < len(statusNames) && s > 0 {
		return statusNames[s]
	}
	return "unknown"
}

// JobResult is what a job did: the steps run, in order (a step that
// failed without Continue is the last), and whether the reset after it
// succeeded.
type JobResult struct {
	Steps []StepResult
	// ResetErr is set when the sandbox could not be made clean after the
	// job (processes that would not die, a directory it could not empty):
	// the sandbox must be destroyed, not reused.
	ResetErr syscall.Errno
}

// StepResult is one step's outcome.
type StepResult struct {
	Status   Status
	ExitCode int            // -1 when killed by a signal
	Signal   syscall.Signal // the killing signal, or 0
	CPU      time.Duration
	Wall     time.Duration
	// PeakMemoryBytes is the largest resident set of the program or a
	// child it waited for.
	PeakMemoryBytes uint64
	Stdout, Stderr  []byte
	// StdoutTruncated and StderrTruncated: the stream outgrew
	// OutputBytes (the status is then OutputLimit).
	StdoutTruncated, StderrTruncated bool
	// Errno and What say why the step could not run as asked (FileError,
	// InternalError): "filein", "exec", "fork", ...
	Errno syscall.Errno
	What  string
	Files []FileOut
}

// FileOut is an output file read back: Data, or Err (ENOENT: missing;
// EFBIG: larger than FileOutBytes; EACCES: reached through a symlink).
type FileOut struct {
	Name string
	Data []byte
	Err  syscall.Errno
}
