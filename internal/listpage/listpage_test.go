package listpage

import (
	"fmt"
	"testing"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

// Paging by token visits every sandbox once, in order, ties of creation
// time included, and a bad token is Invalid.
func TestPagesVisitEachOnce(t *testing.T) {
	var all []*warrenv1.Sandbox
	for i := range 10 {
		all = append(all, &warrenv1.Sandbox{Id: fmt.Sprintf("s%d", 9-i), CreatedAtUnixMs: int64(i / 3)})
	}
	Sort(all)
	for size := 1; size <= 11; size++ {
		var got []string
		tok := ""
		for pages := 0; ; pages++ {
			if pages > 20 {
				t.Fatal("paging does not end")
			}
			res, err := Cut(all, &warrenv1.ListRequest{PageSize: int32(size), PageToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range res.GetSandboxes() {
				got = append(got, s.GetId())
			}
			if tok = res.GetNextPageToken(); tok == "" {
				break
			}
		}
		if len(got) != 10 {
			t.Fatalf("page size %d: %v", size, got)
		}
		for i, id := range got {
			if id != all[i].GetId() {
				t.Fatalf("page size %d: %v, want the sorted order", size, got)
			}
		}
	}
	if _, err := Cut(all, &warrenv1.ListRequest{PageToken: "x"}); err == nil {
		t.Fatal("bad token accepted")
	}
}
