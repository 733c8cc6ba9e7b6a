// Package holes writes file content so that its all-zero blocks stay
// holes: a sparse file copied through a stream (a tar archive, whose
// reader hands out zeros for holes) takes on disk what it took at its
// source, not its length.
package holes

import (
	"bytes"
	"io"

	"golang.org/x/sys/unix"
)

// Block is the unit of hole detection: the page and ext4 block size, so
// a block skipped is a block the filesystem never allocates.
const Block = 4 << 10

var zeros [Block]byte

// Fill reads into buf until it is full or r fails (io.EOF included): whole
// blocks, so that a zero block split across two reads is still seen.
func Fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// WriteAt writes the runs of non-zero blocks of buf at off and skips the
// zero ones. The caller ftruncates the file to its length at the end, so
// that a trailing hole is not lost.
func WriteAt(fd int, buf []byte, off int64) error {
	run := -1 // start of the pending non-zero run
	for i := 0; i <= len(buf); i += Block {
		zero := i == len(buf)
		if !zero {
			blk := buf[i:min(i+Block, len(buf))]
			zero = bytes.Equal(blk, zeros[:len(blk)])
		}
		if !zero && run < 0 {
			run = i
		}
		if zero && run >= 0 {
			if err := pwriteAll(fd, buf[run:min(i, len(buf))], off+int64(run)); err != nil {
				return err
			}
			run = -1
		}
	}
	if run >= 0 {
		return pwriteAll(fd, buf[run:], off+int64(run))
	}
	return nil
}

func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
