// Package atomicfile replaces small files durably: readers see the old
// content or the new, never a part, also after a machine crash.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data: through a temp file in path's directory
// whose name starts with tmpPrefix (unique, so that concurrent writers,
// on other nodes of a shared filesystem too, do not collide), given perm
// and fsynced, renamed over path; then the directory is fsynced. On error
// the temp file is removed and path is unchanged.
func Write(path, tmpPrefix string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), tmpPrefix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs the directory dir, making the entries made or renamed in
// it durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
