package daemon

import (
	"bytes"
	"slices"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
	"github.com/warrenrl/warren/internal/errdefs"
	"github.com/warrenrl/warren/internal/sandboxfs"
)

func TestFiles(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "files"})
	id := "files"

	if _, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/work/a/b.txt", Content: []byte("hello"), MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/work/a/b.txt", Content: []byte(" world"), Append: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/work/run.sh", Content: []byte("#!/bin/sh\necho ran\n"), Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	// Visible to processes, and the other way round.
	if res := e.sh(id, "cat /work/a/b.txt; /work/run.sh; echo made > /work/c.txt"); string(res.GetStdout()) != "hello worldran\n" {
		t.Fatalf("process view: %q %q", res.GetStdout(), res.GetStderr())
	}
	rf, err := e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: "/work/c.txt"})
	if err != nil || string(rf.GetContent()) != "made\n" || rf.GetSize() != 5 || !rf.GetEof() {
		t.Fatalf("read %v %v", rf, err)
	}
	rf, err = e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: "/work/a/b.txt", Offset: 6, Length: 3})
	if err != nil || string(rf.GetContent()) != "wor" || rf.GetSize() != 11 || rf.GetEof() {
		t.Fatalf("read range %v %v", rf, err)
	}
	st, err := e.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: "/work/run.sh"})
	if err != nil || st.GetMode() != 0o755 || st.GetType() != "file" || st.GetSize() != 19 || st.GetMtimeUnixMs() == 0 {
		t.Fatalf("stat %v %v", st, err)
	}
	if _, err := e.m.MakeDir(ctx, &warrenv1.MakeDirRequest{SandboxId: id, Path: "/work/d/e", Parents: true}); err != nil {
		t.Fatal(err)
	}
	ls, err := e.m.ListFiles(ctx, &warrenv1.ListFilesRequest{SandboxId: id, Path: "/work"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range ls.GetFiles() {
		names = append(names, f.GetName())
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "c.txt", "d", "run.sh"}) {
		t.Fatalf("list %v", names)
	}
	if _, err := e.m.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/work/d"}); errdefs.CategoryOf(err) == errdefs.Unknown || err == nil {
		t.Fatalf("non-recursive remove of a tree: %v", err)
	}
	if _, err := e.m.RemoveFile(ctx, &warrenv1.RemoveFileRequest{SandboxId: id, Path: "/work/d", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.StatFile(ctx, &warrenv1.StatFileRequest{SandboxId: id, Path: "/work/d"})
	wantCat(t, err, errdefs.NotFound, "")

	// Symlinks resolve inside the sandbox: /etc/passwd of the sandbox, not
	// the host's, whichever way the link points.
	e.sh(id, "ln -s /etc/passwd /work/pw; ln -s ../../../../../../etc/passwd /work/pw2")
	for _, p := range []string{"/work/pw", "/work/pw2"} {
		rf, err = e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: p})
		if err != nil || !bytes.Contains(rf.GetContent(), []byte("nobody")) || bytes.Contains(rf.GetContent(), []byte("daemon:")) {
			t.Fatalf("read through %s: %q %v", p, rf.GetContent(), err)
		}
	}
	// User names resolve through sandboxfs too: a symlinked /etc/passwd
	// pointing "outside" still reads the sandbox's own files.
	e.sh(id, "mkdir -p /alt && cp /etc/passwd /alt/passwd && echo 'rl:x:4321:4321::/home/rl:/bin/sh' >> /alt/passwd && rm /etc/passwd && ln -s ../../../../alt/passwd /etc/passwd")
	if res := e.exec(&warrenv1.ExecRequest{SandboxId: id, Shell: "id -u", User: "rl"}); string(res.GetStdout()) != "4321\n" {
		t.Fatalf("user through symlinked passwd: %q %q", res.GetStdout(), res.GetStderr())
	}

	// Tar out and in.
	var tarball bytes.Buffer
	if err := e.m.TarOut(ctx, id, "/work/a", &tarball, sandboxfs.TarOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.m.TarIn(ctx, id, "/copy", bytes.NewReader(tarball.Bytes())); err != nil {
		t.Fatal(err)
	}
	if res := e.sh(id, "cat /copy/b.txt"); string(res.GetStdout()) != "hello world" {
		t.Fatalf("tar round trip: %q %q", res.GetStdout(), res.GetStderr())
	}
	for _, dir := range []string{"out", "in"} {
		if v := metricValue(t, e.metrics.ArchiveBytes.WithLabelValues(dir)); v != float64(tarball.Len()) {
			t.Errorf("warren_archive_bytes_total{direction=%q} = %v, want the archive's %d bytes", dir, v, tarball.Len())
		}
	}

	// Errors.
	_, err = e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: "/nope"})
	wantCat(t, err, errdefs.NotFound, "")
	_, err = e.m.ReadFile(ctx, &warrenv1.ReadFileRequest{SandboxId: id, Path: "/work/c.txt", Offset: -1})
	wantCat(t, err, errdefs.Invalid, "")
	_, err = e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/x", Mode: 0o170000})
	wantCat(t, err, errdefs.Invalid, "mode")
	_, err = e.m.ListFiles(ctx, &warrenv1.ListFilesRequest{SandboxId: "nosuch", Path: "/"})
	wantCat(t, err, errdefs.NotFound, "nosuch")
	_, err = e.m.ListFiles(ctx, &warrenv1.ListFilesRequest{SandboxId: id, Path: "/work", PageToken: "garbage"})
	wantCat(t, err, errdefs.Invalid, "page token")
	// A file of the image's layer is copied up when written: the write
	// reopens the O_PATH descriptor it checked, through /proc/self/fd.
	if _, err := e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/etc/group", Content: []byte("extra:x:7:\n"), Append: true}); err != nil {
		t.Fatal(err)
	}
	if res := e.sh(id, "tail -n 1 /etc/group"); string(res.GetStdout()) != "extra:x:7:\n" {
		t.Fatalf("appended to a lower file: %q", res.GetStdout())
	}
	// The sandbox's /proc is the kernel's, not the sandbox's files.
	_, err = e.m.WriteFile(ctx, &warrenv1.WriteFileRequest{SandboxId: id, Path: "/proc/1/oom_score_adj", Content: []byte("-1000")})
	wantCat(t, err, errdefs.PermissionDenied, "/proc")
}

// TestListFilesPages: page_size and page_token pass through to the
// sandbox's file system and next_page_token comes back until the last
// page.
func TestListFilesPages(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	e.create(&warrenv1.CreateRequest{Id: "pages"})
	e.sh("pages", "mkdir /d && cd /d && touch a b c d e")
	req := &warrenv1.ListFilesRequest{SandboxId: "pages", Path: "/d", PageSize: 2}
	var names []string
	for pages := 1; ; pages++ {
		res, err := e.m.ListFiles(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GetFiles()) > 2 || pages > 3 {
			t.Fatalf("page %d: %d entries", pages, len(res.GetFiles()))
		}
		for _, f := range res.GetFiles() {
			names = append(names, f.GetName())
		}
		if res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("pages held %v", names)
	}
}
