package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Report is what every benchmark returns: one JSON object, or a table.
type Report interface {
	// Table writes the human-readable form.
	Table(w io.Writer) error
}

// WriteJSON writes v as one indented JSON object.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// table collects rows and prints them aligned.
type table struct {
	header []string
	rows   [][]string
	left   bool // left-align the cells (default: right)
}

func newTable(header ...string) *table { return &table{header: header} }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) error {
	flags := tabwriter.AlignRight
	if t.left {
		flags = 0
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', flags)
	line := func(cells []string) {
		if t.left {
			fmt.Fprintln(tw, strings.Join(cells, "\t"))
			return
		}
		// A terminated last cell is right-aligned too.
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	line(t.header)
	for _, r := range t.rows {
		line(r)
	}
	return tw.Flush()
}

// ms formats milliseconds.
func ms(v float64) string {
	switch {
	case math.IsNaN(v) || v == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 1000:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// num formats a rate or a size.
func num(v float64) string {
	switch {
	case math.IsNaN(v) || v == 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// ratioStr formats an optional ratio as "1.23x".
func ratioStr(r *float64) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%.2fx", *r)
}

// writeNotes prints notes below a table.
func writeNotes(w io.Writer, notes []string) {
	for _, n := range notes {
		fmt.Fprintln(w, "note: "+n)
	}
}
