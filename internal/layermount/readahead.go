package layermount

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsIocGetFSSysfsPath is FS_IOC_GETFSSYSFSPATH (Linux 6.10),
// _IOR(0x15, 1, struct fs_sysfs_path{u8 len; u8 name[128]}): the
// filesystem's directory under /sys/fs. For a file-backed EROFS mount it
// is "erofs/<bdi>", the name of the mount's own backing_dev_info, which
// is how a mount is tied to its /sys/class/bdi entry.
const fsIocGetFSSysfsPath = 0x80811501

// sysfsName returns the /sys/fs name of the filesystem mounted at dir,
// e.g. "erofs/erofs-12".
func sysfsName(dir string) (string, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var buf [129]byte
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocGetFSSysfsPath, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return "", e
	}
	n := min(int(buf[0]), len(buf)-1)
	return string(buf[1 : 1+n]), nil
}

// readAheadFile returns the read_ahead_kb file that governs EROFS's
// readahead of the layer's files: the mount's own bdi when file-backed,
// the loop device's queue otherwise.
func (c *Cache) readAheadFile(e *entry) (string, error) {
	if e.dev != "" {
		return filepath.Join("/sys/block", filepath.Base(e.dev), "queue", "read_ahead_kb"), nil
	}
	name, err := sysfsName(c.MountPoint(e.key))
	if err != nil {
		return "", fmt.Errorf("FS_IOC_GETFSSYSFSPATH (Linux 6.10): %w", err)
	}
	fs, bdi, ok := strings.Cut(name, "/")
	if !ok || fs != "erofs" || bdi == "" || strings.Contains(bdi, "/") || bdi == ".." {
		return "", fmt.Errorf("unexpected sysfs name %q", name)
	}
	return filepath.Join("/sys/class/bdi", bdi, "read_ahead_kb"), nil
}

// setReadAhead writes Options.ReadAheadKB for e's mount; e.mu is held.
// Failing to is logged, not fatal: the layer still works with the
// kernel's default window.
func (c *Cache) setReadAhead(e *entry) {
	p, err := c.readAheadFile(e)
	if err == nil {
		err = os.WriteFile(p, []byte(strconv.Itoa(c.opts.ReadAheadKB)), 0)
	}
	if err != nil {
		c.fallback("readahead", "layer readahead not set; the kernel's default applies", "key", e.key, "read_ahead_kb", c.opts.ReadAheadKB, "err", err)
	}
}

// readAheadKB reads the current readahead window of e's mount, 0 when
// unknown; e.mu is held.
func (c *Cache) readAheadKB(e *entry) int {
	if !e.mounted {
		return 0
	}
	p, err := c.readAheadFile(e)
	if err != nil {
		return 0
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}
