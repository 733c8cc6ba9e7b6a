package backend

import (
	"context"
	"image"

	"github.com/warrenrl/warren/internal/errdefs"
)

// Display is implemented by sandboxes with a virtual screen, keyboard and
// pointer (the fullvm backend's VMs): what an agent that works by
// looking at a screen needs.
type Display interface {
	// Screenshot is the screen as it is now.
	Screenshot(ctx context.Context) (image.Image, error)
	// SendInput sends events to the keyboard and pointer in order.
	SendInput(ctx context.Context, events []InputEvent) error
	// VNC is where a VNC client reaches the screen: a unix socket path
	// on the node.
	VNC() string
}

// InputEvent is one keyboard or pointer event.
type InputEvent struct {
	// Kind is "key", "button" or "move".
	Kind string
	// Key is a key by QEMU's QKeyCode name ("a", "ret", "shift",
	// "ctrl", "f1"...); Button is "left", "right", "middle", "wheel-up"
	// or "wheel-down".
	Key, Button string
	// Down: pressed (true) or released (false).
	Down bool
	// X and Y are the pointer's position for a move, in pixels from the
	// screen's top left.
	X, Y int
}

// usKeys are the unshifted characters of a US keyboard by QKeyCode;
// usShifted the shifted ones by the key they are on.
var (
	usKeys = map[rune]string{' ': "spc", '\n': "ret", '\t': "tab", '-': "minus", '=': "equal",
		'[': "bracket_left", ']': "bracket_right", '\\': "backslash", ';': "semicolon", '\'': "apostrophe",
		'`': "grave_accent", ',': "comma", '.': "dot", '/': "slash"}
	usShifted = map[rune]string{'!': "1", '@': "2", '#': "3", '$': "4", '%': "5", '^': "6", '&': "7", '*': "8",
		'(': "9", ')': "0", '_': "minus", '+': "equal", '{': "bracket_left", '}': "bracket_right", '|': "backslash",
		':': "semicolon", '"': "apostrophe", '~': "grave_accent", '<': "comma", '>': "dot", '?': "slash"}
)

// TextKeys are the key events that type text on a US keyboard: each
// character's key pressed and released, shift held around those that
// need it. Invalid for a character the keyboard has no key for.
func TextKeys(text string) ([]InputEvent, error) {
	var out []InputEvent
	press := func(key string, shift bool) {
		if shift {
			out = append(out, InputEvent{Kind: "key", Key: "shift", Down: true})
		}
		out = append(out, InputEvent{Kind: "key", Key: key, Down: true}, InputEvent{Kind: "key", Key: key})
		if shift {
			out = append(out, InputEvent{Kind: "key", Key: "shift"})
		}
	}
	for i, r := range text {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			press(string(r), false)
		case r >= 'A' && r <= 'Z':
			press(string(r-'A'+'a'), true)
		case usKeys[r] != "":
			press(usKeys[r], false)
		case usShifted[r] != "":
			press(usShifted[r], true)
		default:
			return nil, errdefs.Invalidf("text: character %q at byte %d has no key on a US keyboard", r, i)
		}
	}
	return out, nil
}
