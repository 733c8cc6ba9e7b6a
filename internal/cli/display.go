package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	warrenv1 "github.com/warrenrl/warren/gen/warren/v1"
)

func newScreenshotCommand() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "screenshot ID -o FILE.png",
		Short: "Save a sandbox's screen as a PNG (backend fullvm)",
		Long: `Save a running sandbox's screen as it is now, as a PNG: sandboxes with a
virtual display (backend fullvm, docs/FULLVM.md). "-o -" writes it to
stdout.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return usagef("-o FILE is required (- for stdout)")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			r, err := cl.Screenshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out == "-" {
				_, err = cmd.OutOrStdout().Write(r.GetPng())
				return err
			}
			if err := os.WriteFile(out, r.GetPng(), 0o644); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %dx%d\n", out, r.GetWidth(), r.GetHeight())
			return err
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "the PNG file to write (- for stdout)")
	return c
}

func newInputCommand() *cobra.Command {
	var text string
	c := &cobra.Command{
		Use:   "input ID [EVENT...]",
		Short: "Send keys and pointer events to a sandbox's screen (backend fullvm)",
		Long: `Send keyboard and pointer events to a running sandbox's virtual display
(backend fullvm), in order, then --text typed key by key (US layout).
An EVENT is one of:
  key:NAME[:down|up]      a key by QEMU's QKeyCode name (a, 1, ret, spc,
                          esc, tab, backspace, shift, ctrl, alt, up, f1...);
                          pressed and released unless down or up is given
  click:BUTTON[:down|up]  left, right, middle, wheel-up, wheel-down
  move:X,Y                the pointer to pixel X,Y from the top left
For example: warren sandbox input ID move:100,200 click:left --text 'ls\n'
(--text takes \n for Enter and \t for Tab).`,
		Args: minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var evs []*warrenv1.SendInputEvent
			for _, a := range args[1:] {
				e, err := parseInputEvent(a)
				if err != nil {
					return err
				}
				evs = append(evs, e)
			}
			t := strings.NewReplacer(`\n`, "\n", `\t`, "\t").Replace(text)
			if len(evs) == 0 && t == "" {
				return usagef("give events or --text")
			}
			cl, err := NewClient(cmd)
			if err != nil {
				return err
			}
			defer cl.Close()
			return cl.SendInput(cmd.Context(), args[0], evs, t)
		},
	}
	c.Flags().StringVar(&text, "text", "", `text to type after the events (\n is Enter, \t Tab)`)
	return c
}

// parseInputEvent reads key:NAME[:down|up], click:BUTTON[:down|up] or
// move:X,Y.
func parseInputEvent(s string) (*warrenv1.SendInputEvent, error) {
	kind, rest, _ := strings.Cut(s, ":")
	switch kind {
	case "key", "click":
		name, action, _ := strings.Cut(rest, ":")
		if name == "" || (action != "" && action != "down" && action != "up") {
			return nil, usagef("event %q: want %s:NAME[:down|up]", s, kind)
		}
		e := &warrenv1.SendInputEvent{Kind: "key", Key: name, Action: action}
		if kind == "click" {
			e = &warrenv1.SendInputEvent{Kind: "button", Button: name, Action: action}
		}
		return e, nil
	case "move":
		xs, ys, ok := strings.Cut(rest, ",")
		x, err1 := strconv.Atoi(xs)
		y, err2 := strconv.Atoi(ys)
		if !ok || err1 != nil || err2 != nil {
			return nil, usagef("event %q: want move:X,Y", s)
		}
		return &warrenv1.SendInputEvent{Kind: "move", X: int32(x), Y: int32(y)}, nil
	}
	return nil, usagef("event %q: want key:NAME, click:BUTTON or move:X,Y", s)
}
