package cli

import "testing"

// TestParseInputEvent: `warren sandbox input`'s events become the API's
// (a click is a button, the action passes through), and a malformed one
// is a usage error.
func TestParseInputEvent(t *testing.T) {
	e, err := parseInputEvent("key:ctrl:down")
	if err != nil || e.GetKind() != "key" || e.GetKey() != "ctrl" || e.GetAction() != "down" {
		t.Fatalf("key:ctrl:down: %v %v", e, err)
	}
	e, err = parseInputEvent("click:left")
	if err != nil || e.GetKind() != "button" || e.GetButton() != "left" || e.GetAction() != "" {
		t.Fatalf("click:left: %v %v", e, err)
	}
	e, err = parseInputEvent("move:10,20")
	if err != nil || e.GetKind() != "move" || e.GetX() != 10 || e.GetY() != 20 {
		t.Fatalf("move:10,20: %v %v", e, err)
	}
	for _, bad := range []string{"key:", "key:a:sideways", "move:1", "move:a,b", "tap:x"} {
		if _, err := parseInputEvent(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
