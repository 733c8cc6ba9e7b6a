package testutil

import (
	"archive/tar"
	"io"
	"iter"
	"testing"
)

// TarEntries iterates over the entries of the tar stream r, each with a
// reader of its data (valid until the next entry); a broken stream
// fails the test. Iterate from the test's goroutine.
func TarEntries(t testing.TB, r io.Reader) iter.Seq2[*tar.Header, io.Reader] {
	return func(yield func(*tar.Header, io.Reader) bool) {
		t.Helper()
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatalf("reading the archive: %v", err)
			}
			if !yield(h, tr) {
				return
			}
		}
	}
}
