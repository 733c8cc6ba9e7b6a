package tarx

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// segment is a run of data in a sparse file.
type segment struct{ off, n int64 }

// maxSegments bounds a sparse entry's map (~40 bytes a segment, all in
// the reader's memory before the data): a file fragmented past it is
// written whole.
const maxSegments = 4096

// dataSegments lists fd's data with SEEK_DATA/SEEK_HOLE up to size, or
// returns nil when the file has no hole there, has too many segments, or
// the filesystem cannot say (the file is then written whole). A last
// segment of length 0 at size marks a trailing hole, as GNU tar writes
// it, so that extractors that only write the data still set the size.
func dataSegments(fd int, size int64) []segment {
	var segs []segment
	var data int64
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			break // only a hole from off on
		}
		if err != nil || d < off {
			return nil
		}
		if d >= size {
			break
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil || h <= d {
			return nil
		}
		h = min(h, size)
		if len(segs) == maxSegments {
			return nil
		}
		segs = append(segs, segment{d, h - d})
		data += h - d
		off = h
	}
	if data == size {
		return nil // no hole: a plain entry
	}
	if len(segs) == 0 || segs[len(segs)-1].off+segs[len(segs)-1].n < size {
		segs = append(segs, segment{size, 0})
	}
	return segs
}

// sparseFile writes hdr as a PAX sparse entry (format 1.0) of f's data
// segments. Go's archive/tar drops GNU.sparse records from the headers
// it writes (its sparse writing is disabled), so the extended header and
// the entry's header are written here, between two entries of c.tw.
// The entry is named dir/GNUSparseFile.0/base, as GNU tar names it, for
// readers that do not know the format; the records give the real name
// and size.
func (c *creator) sparseFile(f *os.File, hdr *tar.Header, segs []segment) error {
	m := strconv.AppendInt(nil, int64(len(segs)), 10)
	m = append(m, '\n')
	var data int64
	for _, s := range segs {
		m = strconv.AppendInt(m, s.off, 10)
		m = append(m, '\n')
		m = strconv.AppendInt(m, s.n, 10)
		m = append(m, '\n')
		data += s.n
	}
	m = append(m, make([]byte, pad(int64(len(m))))...)
	dir, base := path.Split(hdr.Name)
	recs := map[string]string{}
	for k, v := range hdr.PAXRecords {
		recs[k] = v
	}
	recs["GNU.sparse.major"] = "1"
	recs["GNU.sparse.minor"] = "0"
	recs["GNU.sparse.name"] = hdr.Name
	recs["GNU.sparse.realsize"] = strconv.FormatInt(hdr.Size, 10)
	recs["mtime"] = paxTime(hdr.ModTime)
	// The stand-in name fits the ustar field: a "path" record would
	// compete with GNU.sparse.name (Python's tarfile applies whichever
	// comes last).
	stand := dir + "GNUSparseFile.0/" + base
	if len(stand) > 100 {
		stand = "GNUSparseFile.0/" + base[max(0, len(base)-84):]
	}
	main := &tar.Header{Name: stand, Mode: hdr.Mode, Uid: hdr.Uid, Gid: hdr.Gid,
		Size: int64(len(m)) + data, ModTime: hdr.ModTime, Typeflag: tar.TypeReg}
	blk := ustarBlock(main, recs)
	var x bytes.Buffer
	keys := make([]string, 0, len(recs))
	for k := range recs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x.WriteString(paxRecord(k, recs[k]))
	}
	xblk := ustarBlock(&tar.Header{Name: dir + "PaxHeaders.0/" + base, Mode: 0o644, Size: int64(x.Len()),
		ModTime: time.Unix(0, 0), Typeflag: tar.TypeXHeader}, nil)
	x.Write(make([]byte, pad(int64(x.Len()))))

	// The entry before is done: flush its padding, then write raw.
	if err := c.tw.Flush(); err != nil {
		return c.writeErr(err)
	}
	for _, b := range [][]byte{xblk, x.Bytes(), blk, m} {
		if _, err := c.w.Write(b); err != nil {
			return c.writeErr(err)
		}
	}
	for _, s := range segs {
		if err := c.copyRange(c.w, f, hdr.Name, s.off, s.n); err != nil {
			return err
		}
	}
	if _, err := c.w.Write(make([]byte, pad(data))); err != nil {
		return c.writeErr(err)
	}
	return nil
}

const blockSize = 512

func pad(n int64) int64 { return -n & (blockSize - 1) }

// paxRecord is one "len key=value\n" record; len counts itself.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	n += len(strconv.Itoa(n))
	if r := strconv.Itoa(n) + " " + k + "=" + v + "\n"; len(r) == n {
		return r
	}
	n++
	return strconv.Itoa(n) + " " + k + "=" + v + "\n"
}

// paxTime is t as PAX writes it: seconds, and a fraction only if any.
func paxTime(t time.Time) string {
	s, ns := t.Unix(), t.Nanosecond()
	if ns == 0 {
		return strconv.FormatInt(s, 10)
	}
	sign := ""
	if s < 0 {
		sign, s, ns = "-", -(s + 1), 1e9-ns
	}
	return strings.TrimRight(fmt.Sprintf("%s%d.%09d", sign, s, ns), "0")
}

// ustarBlock is h's 512-byte ustar header (a name past 100 bytes keeps
// its end). A number that does not fit is left zero and, when recs is not
// nil, recorded there as PAX does (the size, the owners; mtime is always
// a record).
func ustarBlock(h *tar.Header, recs map[string]string) []byte {
	b := make([]byte, blockSize)
	str := func(off, n int, s string) { copy(b[off:off+n], s) }
	oct := func(off, n int, v int64) bool {
		s := strconv.FormatInt(v, 8)
		if v < 0 || len(s) > n-1 {
			return false
		}
		copy(b[off:], strings.Repeat("0", n-1-len(s))+s)
		return true
	}
	str(0, 100, h.Name[max(0, len(h.Name)-100):])
	oct(100, 8, h.Mode)
	if !oct(108, 8, int64(h.Uid)) && recs != nil {
		recs["uid"] = strconv.Itoa(h.Uid)
	}
	if !oct(116, 8, int64(h.Gid)) && recs != nil {
		recs["gid"] = strconv.Itoa(h.Gid)
	}
	if !oct(124, 12, h.Size) && recs != nil {
		recs["size"] = strconv.FormatInt(h.Size, 10)
	}
	oct(136, 12, max(h.ModTime.Unix(), 0))
	b[156] = h.Typeflag
	copy(b[257:], "ustar\x0000")
	copy(b[148:156], "        ")
	var sum int64
	for _, c := range b {
		sum += int64(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}
