package container

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/testutil"
)

// zombieChildren lists the pids of this process's children that have
// exited and not been reaped.
func zombieChildren(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so from the last ')'.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[0] == "Z" && f[1] == me {
			out = append(out, pid)
		}
	}
	return out
}

// waitNoZombies fails the test if a child of this process stays a zombie
// for more than 5 s.
func waitNoZombies(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		z := zombieChildren(t)
		if len(z) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("unreaped sandbox inits (zombies): %v", z)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitResources fails the test unless the host resources of the backend
// are back to base within 5 s (the reaper removes state in the background).
func waitResources(t *testing.T, opts Options, base []string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := resources(t, opts)
		if slices.Equal(left, base) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("failed creates left %v (before: %v)", left, base)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFailedAttachLeavesNoZombie: when the init stage came up but attach
// failed (here: its start time cannot be read), Create kills the init and
// must also reap it; a killed child nobody waits for stays a zombie for
// the daemon's life.
func TestFailedAttachLeavesNoZombie(t *testing.T) {
	opts := testOptions(t, "attachfail")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitNoZombies(t)
	base := resources(t, opts) // the node's shared mounts
	attachStartTime = func(int) (uint64, error) { return 0, os.ErrNotExist }
	defer func() { attachStartTime = procStartTime }()
	for i := range 3 {
		_, err := b.Create(t.Context(), backend.Spec{ID: "attachfail" + strconv.Itoa(i), Layers: backend.DirLayers(testutil.BusyboxRoot(t))})
		if err == nil {
			t.Fatal("create succeeded with a failing attach")
		}
	}
	waitNoZombies(t)
	waitResources(t, opts, base)
}

// hungFUSE mounts a FUSE file system at a new directory whose server
// answers INIT and the first GETATTR of its root, then stops reading: as a
// shared store whose server hung. The daemon's stat of the layer succeeds
// from the cached attributes; whatever the init stage asks next (mounting
// the overlay over it) waits, killably (the request stays unread). Closing
// the device at the end of the test aborts the connection.
func hungFUSE(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no FUSE: %v", err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40755,user_id=0,group_id=0,allow_other", fd)
	if err := unix.Mount("warren-hung", dir, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Skipf("mount fuse: %v", err)
	}
	t.Cleanup(func() {
		unix.Close(fd) // aborts every request still waiting
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	answered := make(chan error, 1)
	go func() { answered <- serveUntilGetattr(fd) }()
	select {
	case err := <-answered:
		t.Fatalf("fuse server: %v", err)
	case <-time.After(50 * time.Millisecond): // INIT answered; waits for GETATTR
	}
	return dir
}

// serveUntilGetattr answers FUSE_INIT and one FUSE_GETATTR, then returns.
func serveUntilGetattr(fd int) error {
	const (
		opGetattr = 3
		opInit    = 26
	)
	buf := make([]byte, 1<<20+4096)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil {
			return err
		}
		if n < 40 {
			return fmt.Errorf("short request (%d bytes)", n)
		}
		opcode := binary.LittleEndian.Uint32(buf[4:])
		unique := binary.LittleEndian.Uint64(buf[8:])
		var body []byte
		switch opcode {
		case opInit:
			body = make([]byte, 64)                        // fuse_init_out
			binary.LittleEndian.PutUint32(body[0:], 7)     // major
			binary.LittleEndian.PutUint32(body[4:], 31)    // minor
			binary.LittleEndian.PutUint32(body[20:], 4096) // max_write (after max_background, congestion_threshold)
			binary.LittleEndian.PutUint32(body[24:], 1)    // time_gran
		case opGetattr:
			body = make([]byte, 16+88)                    // fuse_attr_out
			binary.LittleEndian.PutUint64(body[0:], 3600) // attr_valid: no second GETATTR
			attr := body[16:]
			binary.LittleEndian.PutUint64(attr[0:], 1)                   // ino
			binary.LittleEndian.PutUint32(attr[60:], unix.S_IFDIR|0o755) // mode
			binary.LittleEndian.PutUint32(attr[64:], 2)                  // nlink
		default:
			return fmt.Errorf("unexpected request %d before GETATTR", opcode)
		}
		out := make([]byte, 16+len(body))
		binary.LittleEndian.PutUint32(out[0:], uint32(len(out)))
		binary.LittleEndian.PutUint64(out[8:], unique)
		copy(out[16:], body)
		if _, err := unix.Write(fd, out); err != nil {
			return err
		}
		if opcode == opGetattr {
			return nil
		}
	}
}

// TestInitThatNeverReports: an init stage that never reports (blocked
// mounting a layer on a hung FUSE store) must not hang Create: the
// caller's ctx ends it, and so does InitTimeout; either way the init is
// killed and reaped and nothing is left behind.
func TestInitThatNeverReports(t *testing.T) {
	opts := testOptions(t, "stuck")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bb := testutil.BusyboxRoot(t)
	base := resources(t, opts) // the node's shared mounts

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.Create(ctx, backend.Spec{ID: "stuckctx", Layers: backend.DirLayers(hungFUSE(t), bb)})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("create took %v past its 300 ms deadline", took)
	}
	if err == nil || errdefs.CategoryOf(err) != errdefs.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("create with a stuck init: %v (category %v), want deadline_exceeded", err, errdefs.CategoryOf(err))
	}

	old := InitTimeout
	InitTimeout = 300 * time.Millisecond
	defer func() { InitTimeout = old }()
	_, err = b.Create(t.Context(), backend.Spec{ID: "stucktimeout", Layers: backend.DirLayers(hungFUSE(t), bb)})
	if errdefs.CategoryOf(err) != errdefs.DeadlineExceeded || !strings.Contains(err.Error(), "did not finish setting up") {
		t.Fatalf("create with a stuck init and no deadline: %v", err)
	}
	waitNoZombies(t)
	waitResources(t, opts, base)
}
