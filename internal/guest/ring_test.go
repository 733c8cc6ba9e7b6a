package guest

import (
	"bytes"
	"testing"
)

// TestRingKeepsTheLatestBytes: a background process's output buffer
// holds the latest limit bytes at their stream offsets, however the
// writes fall across its growth and its wrap, and a read from an offset
// it dropped starts at the oldest byte kept.
func TestRingKeepsTheLatestBytes(t *testing.T) {
	const limit = 10000
	var r ring
	var all []byte
	for i, n := range []int{1, 4095, 3000, 7000, 1, 25000, 123} {
		chunk := bytes.Repeat([]byte{byte('a' + i)}, n)
		for j := range chunk {
			chunk[j] += byte(j % 3)
		}
		r.write(chunk, limit)
		all = append(all, chunk...)
		if len(r.buf) > limit {
			t.Fatalf("buffer of %d bytes, limit %d", len(r.buf), limit)
		}
		start := max(0, int64(len(all))-limit)
		if r.total != int64(len(all)) || r.start != start {
			t.Fatalf("after %d bytes: [%d, %d), want [%d, %d)", len(all), r.start, r.total, start, len(all))
		}
		var got []byte
		off := int64(0)
		for {
			o, b := r.read(off, 777)
			if len(b) == 0 {
				break
			}
			if len(got) == 0 && o != start {
				t.Fatalf("read from 0 starts at %d, want %d", o, start)
			}
			got = append(got, b...)
			off = o + int64(len(b))
		}
		if !bytes.Equal(got, all[start:]) {
			t.Fatalf("after %d bytes: read back %d bytes that differ", len(all), len(got))
		}
	}
}
