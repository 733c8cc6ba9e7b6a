package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenrl/warren/internal/backend"
	"github.com/warrenrl/warren/internal/backend/conformance"
	"github.com/warrenrl/warren/internal/testutil"
)

// nodeUnmount unmounts path (lazily, as `umount -l`) in pid's mount
// namespace from the node: a thread of this process (host root, every
// capability over every namespace the sandbox has, more than `nsenter -U
// -m` gives) enters it alone. Only a locked mount (MNT_LOCKED) refuses
// it, with EINVAL, whoever asks. setns into the user namespace too is
// refused to a multithreaded process, and adds nothing: the kernel checks
// the lock before any capability. The thread is never given back to the
// runtime (throwawayThread): it is in the sandbox's namespace.
func nodeUnmount(pid int, path string) error {
	sm, err := openSandboxMounts(pid)
	if err != nil {
		return err
	}
	defer sm.close()
	return throwawayThread(func() error {
		if err := sm.enter(); err != nil {
			return err
		}
		return unix.Unmount(path, unix.MNT_DETACH)
	})
}

// holdsSysAdmin tells whether pid holds CAP_SYS_ADMIN (in its user
// namespace): in its effective or permitted set.
func holdsSysAdmin(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	held := false
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if k != "CapEff" && k != "CapPrm" {
			continue
		}
		set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		held = held || set&(1<<unix.CAP_SYS_ADMIN) != 0
	}
	return held
}

// TestMountsLockedAgainstTheNodeUserNS: the masks of a sandbox in a user
// namespace cannot be taken off even by a process holding every capability
// in its namespaces (the node entering them, as `nsenter -U -m -t PID`):
// after a create, unmounting /proc/timer_list or /dev is EINVAL (locked,
// init_linux.c, userns_namespaces). After a CRIU restore they are NOT
// locked yet (docs/SECURITY.md, docs/HIBERNATE.md: CRIU builds the tree
// from inside the user namespace): this test states that gap, so it fails
// when it closes (make the restore half assert EINVAL then), and checks
// what holds there today: no process in the sandbox holds CAP_SYS_ADMIN,
// PID 1 (the agent) included (init_linux.c, drop_sys_admin), so root
// inside cannot unmount them. The node's unmount succeeding on the restored sandbox is
// also the proof that nodeUnmount tells a locked mount from an unlocked one.
func TestMountsLockedAgainstTheNodeUserNS(t *testing.T) {
	requireCRIU(t)
	if err := UserNSSupported(); err != nil {
		t.Skipf("this kernel runs no sandbox in a user namespace: %v", err)
	}
	opts := testOptions(t, "mlock-")
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	spec := backend.Spec{ID: "mlock1", Layers: backend.DirLayers(testutil.BusyboxRoot(t)), MemoryBytes: 128 << 20, UserNS: true}
	sb, err := b.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	if holdsSysAdmin(t, sb.(*sandbox).st.Pid) {
		t.Error("created sandbox: PID 1 holds CAP_SYS_ADMIN")
	}
	masks := []string{"/proc/timer_list", "/dev"}
	for _, p := range masks {
		if err := nodeUnmount(sb.(*sandbox).st.Pid, p); !errors.Is(err, unix.EINVAL) {
			t.Errorf("created sandbox: the node unmounted %s in its namespaces: %v, want EINVAL (locked)", p, err)
		}
	}

	dir := filepath.Join(opts.StateDir, "checkpoints", "mlock1")
	if err := sb.(backend.Checkpointer).Checkpoint(t.Context(), dir); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}
	spec.Restore = dir
	rs, err := b.Create(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Destroy(context.Background())
	// What holds today: no process inside holds CAP_SYS_ADMIN (PID 1 let
	// go of it at create, CRIU restored its sets as dumped; the others
	// lose it with the bounding set), so none can take a mask off.
	if holdsSysAdmin(t, rs.(*sandbox).st.Pid) {
		t.Error("restored sandbox: PID 1 holds CAP_SYS_ADMIN, over mounts that are not locked")
	}
	r := conformance.Exec(t, rs, backend.ProcSpec{Argv: []string{"sh", "-c", "umount /proc/timer_list; umount -l /dev; wc -c < /proc/timer_list; ls /dev/null"}}, "")
	if r.Stdout != "0\n/dev/null\n" {
		t.Errorf("root in the restored sandbox took its mounts off: %+v", r)
	}
	// The gap: the restored mounts are not locked.
	for _, p := range masks {
		err := nodeUnmount(rs.(*sandbox).st.Pid, p)
		if errors.Is(err, unix.EINVAL) {
			t.Errorf("restored sandbox: %s is locked now (%v): the gap docs/SECURITY.md describes closed; update the docs and assert EINVAL here as after a create", p, err)
		} else if err != nil {
			t.Errorf("restored sandbox: unmount %s from the node: %v", p, err)
		}
	}
}
