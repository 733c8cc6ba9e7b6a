// Command chrootescape is a test program that runs inside a sandbox as its
// root: it leaves its root the classic way (chroot into a subdirectory
// while its working directory stays outside it, climb with "..", chroot
// there), then prints what it found as JSON: the entries of the directory
// it reached, whether a file can be created there, and whether it is
// still the sandbox's own root (the marker file the test wrote).
package main

import (
	"encoding/json"
	"os"

	"golang.org/x/sys/unix"
)

type report struct {
	Escaped  bool     `json:"escaped"` // the chroot and climb succeeded
	Err      string   `json:"err,omitempty"`
	Entries  []string `json:"entries"`
	Marker   bool     `json:"marker"` // the sandbox's own /marker is there: still inside
	WriteErr string   `json:"write_err,omitempty"`
}

func main() {
	var r report
	defer func() { _ = json.NewEncoder(os.Stdout).Encode(r) }()
	if err := os.MkdirAll("/tmp/escape", 0o755); err != nil {
		r.Err = err.Error()
		return
	}
	if err := unix.Chdir("/"); err != nil {
		r.Err = err.Error()
		return
	}
	if err := unix.Chroot("/tmp/escape"); err != nil {
		r.Err = "chroot: " + err.Error()
		return
	}
	for i := 0; i < 64; i++ {
		if err := unix.Chdir(".."); err != nil {
			r.Err = "climb: " + err.Error()
			return
		}
	}
	if err := unix.Chroot("."); err != nil {
		r.Err = "chroot .: " + err.Error()
		return
	}
	r.Escaped = true
	ents, err := os.ReadDir("/")
	if err != nil {
		r.Err = "read /: " + err.Error()
	}
	for _, e := range ents {
		r.Entries = append(r.Entries, e.Name())
	}
	_, err = os.Stat("/marker")
	r.Marker = err == nil
	if f, err := os.Create("/escaped"); err != nil {
		r.WriteErr = err.Error()
	} else {
		f.Close()
	}
}
