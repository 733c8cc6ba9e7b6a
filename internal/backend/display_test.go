package backend

import (
	"testing"

	"github.com/warrenrl/warren/internal/errdefs"
)

// TestTextKeys: text becomes each character's key pressed and released,
// with shift held around upper case and shifted punctuation; a character
// with no key on a US keyboard is Invalid.
func TestTextKeys(t *testing.T) {
	evs, err := TextKeys("a$\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []InputEvent{
		{Kind: "key", Key: "a", Down: true}, {Kind: "key", Key: "a"},
		{Kind: "key", Key: "shift", Down: true}, {Kind: "key", Key: "4", Down: true}, {Kind: "key", Key: "4"}, {Kind: "key", Key: "shift"},
		{Kind: "key", Key: "ret", Down: true}, {Kind: "key", Key: "ret"},
	}
	if len(evs) != len(want) {
		t.Fatalf("events %+v", evs)
	}
	for i := range want {
		if evs[i] != want[i] {
			t.Fatalf("event %d: %+v, want %+v", i, evs[i], want[i])
		}
	}
	if evs, _ := TextKeys("Z"); len(evs) != 4 || evs[1].Key != "z" || evs[0].Key != "shift" {
		t.Fatalf("Z: %+v", evs)
	}
	if _, err := TextKeys("é"); errdefs.CategoryOf(err) != errdefs.Invalid {
		t.Fatalf("é: %v, want invalid", err)
	}
}
