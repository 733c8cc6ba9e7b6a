package cli

import "testing"

// --disk-reserve takes a size or a percentage of the state directory's
// filesystem, capped at 10 GiB.
func TestParseReserve(t *testing.T) {
	dir := t.TempDir()
	if n, err := parseReserve("2Gi", dir); err != nil || n != 2<<30 {
		t.Errorf("2Gi: %d %v", n, err)
	}
	if n, err := parseReserve("0", dir); err != nil || n != 0 {
		t.Errorf("0: %d %v", n, err)
	}
	if n, err := parseReserve("5%", dir); err != nil || n <= 0 || n > maxPercentReserve {
		t.Errorf("5%%: %d %v", n, err)
	}
	for _, bad := range []string{"x%", "100%", "-1%", "lots"} {
		if _, err := parseReserve(bad, dir); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
