package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
)

func rec(id string, st warrenv1.SandboxState) Record {
	return Record{
		ID:            id,
		Backend:       "container",
		BackendState:  []byte(`{"pid":42}`),
		ImageLayers:   []string{"sha256:aa", "sha256:bb"},
		EtcNameserver: "10.88.0.2",
		Sandbox: &warrenv1.Sandbox{
			Id: id, Image: "busybox", Backend: "container", State: st,
			Labels: map[string]string{"team": "rl"}, CreatedAtUnixMs: 1234,
		},
	}
}

func TestPutGetDeleteList(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Path() != filepath.Join(dir, FileName) {
		t.Fatalf("path %s", s.Path())
	}
	if _, err := s.Get("nope"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("get missing: %v", err)
	}
	if err := s.Put(rec("b", warrenv1.SandboxState_SANDBOX_STATE_CREATING)); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(rec("a", warrenv1.SandboxState_SANDBOX_STATE_RUNNING)); err != nil {
		t.Fatal(err)
	}
	// Replace.
	r := rec("b", warrenv1.SandboxState_SANDBOX_STATE_STOPPED)
	r.Sandbox.DeadReason = "init exited"
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("b")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "b" || got.Backend != "container" || string(got.BackendState) != `{"pid":42}` ||
		len(got.ImageLayers) != 2 || got.ImageLayers[1] != "sha256:bb" || got.EtcNameserver != "10.88.0.2" ||
		got.State() != warrenv1.SandboxState_SANDBOX_STATE_STOPPED || !proto.Equal(got.Sandbox, r.Sandbox) {
		t.Fatalf("got %+v", got)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" {
		t.Fatalf("list %+v", list)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("a"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Get("a"); errdefs.CategoryOf(err) != errdefs.NotFound {
		t.Fatalf("get deleted: %v", err)
	}
}

func TestPersistsAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(rec("x", warrenv1.SandboxState_SANDBOX_STATE_RUNNING)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get("x")
	if err != nil {
		t.Fatal(err)
	}
	if got.Sandbox.GetLabels()["team"] != "rl" || got.Sandbox.GetCreatedAtUnixMs() != 1234 {
		t.Fatalf("got %+v", got.Sandbox)
	}
}

func TestLockedByAnotherOpener(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Open(dir); errdefs.CategoryOf(err) != errdefs.Unavailable {
		t.Fatalf("second open: %v", err)
	}
}

func TestInvalid(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Put(Record{}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("empty id: %v", err)
	}
	if err := s.Put(Record{ID: "a"}); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("nil sandbox: %v", err)
	}
	if _, err := Open(""); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("empty dir: %v", err)
	}
}

func TestConcurrentPuts(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("sb%02d", i)
			if err := s.Put(rec(id, warrenv1.SandboxState_SANDBOX_STATE_RUNNING)); err != nil {
				t.Error(err)
			}
			if i%2 == 0 {
				if err := s.Delete(id); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 32 {
		t.Fatalf("%d records", len(list))
	}
}

// TestGroupedWriteFailsAlone: a write that fails (a key bbolt refuses)
// among concurrent ones, which group commit puts in one transaction,
// fails alone; every other write is committed.
func TestGroupedWriteFailsAlone(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bad := strings.Repeat("x", 40000) // above bbolt's MaxKeySize
	for round := range 20 {
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("r%02d-%02d", round, i)
				if i == 7 {
					id = bad
				}
				errs[i] = s.Put(rec(id, warrenv1.SandboxState_SANDBOX_STATE_RUNNING))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if (err != nil) != (i == 7) {
				t.Fatalf("round %d write %d: %v", round, i, err)
			}
		}
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 20*15 {
		t.Fatalf("%d records, want %d", len(list), 20*15)
	}
}

// TestUnsyncedWithinBoot: commits are not fsync'ed once the boot mark is
// written, and a reopen in the same boot reads them.
func TestUnsyncedWithinBoot(t *testing.T) {
	if bootID() == "" {
		t.Skip("no /proc/sys/kernel/random/boot_id")
	}
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !s.db.NoSync {
		t.Error("commits are synced")
	}
	if mark, _ := os.ReadFile(filepath.Join(dir, FileName+".boot")); string(mark) != bootID() {
		t.Errorf("boot mark %q, want %q", mark, bootID())
	}
	if err := s.Put(rec("a", warrenv1.SandboxState_SANDBOX_STATE_RUNNING)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Salvaged != nil {
		t.Errorf("salvaged within one boot: %+v", s.Salvaged)
	}
	if _, err := s.Get("a"); err != nil {
		t.Fatal(err)
	}
}

// TestEndedBoot: a file marked with another boot's id is moved aside and
// its readable records copied; a torn one leaves an empty store and the
// old file for inspection; a file without a mark (an older daemon, which
// synced every commit) is trusted.
func TestEndedBoot(t *testing.T) {
	if bootID() == "" {
		t.Skip("no /proc/sys/kernel/random/boot_id")
	}
	setMark := func(dir, id string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, FileName+".boot"), []byte(id), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	withRecords := func(ids ...string) string {
		t.Helper()
		dir := t.TempDir()
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if err := s.Put(rec(id, warrenv1.SandboxState_SANDBOX_STATE_RUNNING)); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		return dir
	}

	t.Run("readable", func(t *testing.T) {
		dir := withRecords("a", "b")
		setMark(dir, "an-ended-boot")
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Salvaged == nil || s.Salvaged.Records != 2 || s.Salvaged.Err != nil {
			t.Fatalf("salvage %+v", s.Salvaged)
		}
		if recs, err := s.List(); err != nil || len(recs) != 2 {
			t.Errorf("records %v %v", recs, err)
		}
		if _, err := os.Stat(s.Salvaged.Kept); err != nil {
			t.Errorf("old file: %v", err)
		}
		if mark, _ := os.ReadFile(filepath.Join(dir, FileName+".boot")); string(mark) != bootID() {
			t.Errorf("boot mark %q", mark)
		}
	})
	t.Run("torn", func(t *testing.T) {
		dir := withRecords("a")
		setMark(dir, "an-ended-boot")
		// Tear every page but the two meta pages, as if only they had
		// reached the disk.
		f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		page := int64(os.Getpagesize())
		junk := bytes.Repeat([]byte{0xa5}, int(fi.Size()-2*page))
		if _, err := f.WriteAt(junk, 2*page); err != nil {
			t.Fatal(err)
		}
		f.Close()
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Salvaged == nil || s.Salvaged.Err == nil {
			t.Fatalf("salvage of a torn file %+v", s.Salvaged)
		}
		if err := s.Put(rec("c", warrenv1.SandboxState_SANDBOX_STATE_RUNNING)); err != nil {
			t.Fatal(err)
		}
		if recs, err := s.List(); err != nil || len(recs) != 1 {
			t.Errorf("records %v %v", recs, err)
		}
	})
	t.Run("older daemon", func(t *testing.T) {
		dir := withRecords("a")
		os.Remove(filepath.Join(dir, FileName+".boot"))
		s, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Salvaged != nil {
			t.Errorf("salvaged %+v", s.Salvaged)
		}
		if _, err := s.Get("a"); err != nil {
			t.Fatal(err)
		}
	})
}
