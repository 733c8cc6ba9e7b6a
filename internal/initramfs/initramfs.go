// Package initramfs writes the initial RAM filesystems microVMs boot from:
// the kernel's "newc" cpio format (Documentation/driver-api/early-userspace/
// buffer-format.rst), uncompressed, since the kernel then maps it without
// a decompressor's work and the image is a few MiB.
package initramfs

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// Entry is one file of the archive. Name is its path without a leading
// slash; parent directories are made as needed.
type Entry struct {
	Name string
	Mode os.FileMode // permission bits plus os.ModeDir, os.ModeSymlink; 0 for a regular file's type
	Data []byte      // a regular file's contents; a symlink's target
	// From, when set, is a host file whose contents are the entry's
	// (read at Write time), instead of Data.
	From string
}

// Writer collects entries and writes them as one archive.
type Writer struct {
	entries map[string]Entry
}

// New returns an empty archive.
func New() *Writer { return &Writer{entries: map[string]Entry{}} }

// Add adds e, and its parent directories (0755) unless added already. A
// later Add of the same name replaces the earlier one.
func (w *Writer) Add(e Entry) error {
	name := strings.TrimPrefix(path.Clean("/"+e.Name), "/")
	if name == "" || name == "." {
		return fmt.Errorf("initramfs: empty entry name %q", e.Name)
	}
	e.Name = name
	for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := w.entries[d]; !ok {
			w.entries[d] = Entry{Name: d, Mode: os.ModeDir | 0o755}
		}
	}
	w.entries[name] = e
	return nil
}

// AddFile adds the host file from at name, with mode's permission bits.
func (w *Writer) AddFile(name, from string, mode os.FileMode) error {
	return w.Add(Entry{Name: name, From: from, Mode: mode.Perm()})
}

// Write writes the archive: directories before what they hold (sorted
// names do that), then the trailer.
func (w *Writer) Write(out io.Writer) error {
	names := make([]string, 0, len(w.entries))
	for n := range w.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	bw := bufio.NewWriterSize(out, 1<<20)
	ino := uint32(1)
	for _, n := range names {
		e := w.entries[n]
		data := e.Data
		if e.From != "" {
			b, err := os.ReadFile(e.From)
			if err != nil {
				return fmt.Errorf("initramfs: %s: %w", n, err)
			}
			data = b
		}
		mode := uint32(e.Mode.Perm())
		switch {
		case e.Mode&os.ModeDir != 0:
			mode |= 0o040000
			data = nil
		case e.Mode&os.ModeSymlink != 0:
			mode |= 0o120000
		default:
			mode |= 0o100000
		}
		nlink := uint32(1)
		if e.Mode&os.ModeDir != 0 {
			nlink = 2
		}
		if err := header(bw, ino, mode, nlink, uint32(len(data)), n); err != nil {
			return err
		}
		if _, err := bw.Write(data); err != nil {
			return err
		}
		if err := pad(bw, len(data)); err != nil {
			return err
		}
		ino++
	}
	if err := header(bw, 0, 0, 1, 0, "TRAILER!!!"); err != nil {
		return err
	}
	return bw.Flush()
}

// header writes a newc header and name, padded to 4 bytes.
func header(w *bufio.Writer, ino, mode, nlink, size uint32, name string) error {
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check.
	if _, err := fmt.Fprintf(w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, len(name)+1, 0); err != nil {
		return err
	}
	if _, err := w.WriteString(name + "\x00"); err != nil {
		return err
	}
	return pad(w, 110+len(name)+1)
}

func pad(w *bufio.Writer, n int) error {
	if r := n % 4; r != 0 {
		_, err := w.Write(make([]byte, 4-r))
		return err
	}
	return nil
}
