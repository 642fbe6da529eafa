package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/spf13/cobra"
	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/client"
)

// A paged list command (db list, collection list, import list, user list,
// keys list; tasks list with its own cursor) prints each
// page as it arrives and keeps only that page: a table's header comes once
// and its rows are aligned page by page; -o json and -o yaml write the
// document a gathered list would be ({"<items>": [...], "next_page_token":
// "..."}), one item at a time.

// listing is one paged list command.
type listing[T proto.Message] struct {
	key    string   // the items' key in JSON and YAML ("databases")
	header []string // the table's header
	row    func(T) []string
	// value, if set, is an item's machine value (default: the message's).
	value func(T) any
	// page reads at most limit items (0: the server's page) after token.
	page func(ctx context.Context, c *client.Client, limit int32, token string) (items []T, next string, err error)
}

// streamList runs l from p's token on until p's limit of items (0: all) or
// the end, printing page after page.
func streamList[T proto.Message](g *globals, cmd *cobra.Command, p pageFlags, l listing[T]) error {
	if err := p.check(); err != nil {
		return err
	}
	f, err := g.format()
	if err != nil {
		return err
	}
	cl, ctx, done, err := g.dial(cmd)
	if err != nil {
		return err
	}
	defer done()
	lw := &listWriter{w: cmd.OutOrStdout(), f: f, key: l.key, header: l.header}
	next, seen := p.token, 0
	for {
		limit := int32(0)
		if p.limit > 0 {
			limit = int32(min(p.limit-seen, math.MaxInt32))
		}
		items, token, err := l.page(ctx, cl, limit, next)
		if err != nil {
			return g.connError(cmd, err)
		}
		for _, it := range items {
			var v any = it
			if l.value != nil {
				v = l.value(it)
			}
			if err := lw.item(v, l.row(it)); err != nil {
				return err
			}
		}
		if err := lw.flushPage(); err != nil {
			return err
		}
		seen += len(items)
		if next = token; next == "" || p.limit > 0 && seen >= p.limit {
			return lw.end(next)
		}
	}
}

// listWriter writes a list in format f an item at a time.
type listWriter struct {
	w      io.Writer
	f      format
	key    string
	header []string
	tb     *table
	n      int // items written
}

// item writes one item: its row in a table, else its machine value (a
// message of the API, or a value of the output's conventions).
func (l *listWriter) item(m any, row []string) error {
	defer func() { l.n++ }()
	if pm, ok := m.(proto.Message); ok {
		m = protoValue(pm)
	}
	switch l.f {
	case formatJSON:
		var buf bytes.Buffer
		if l.n == 0 {
			buf.WriteString("{\n  " + jsonString(l.key) + ": [\n")
		} else {
			buf.WriteString(",\n")
		}
		enc := json.NewEncoder(&buf)
		enc.SetIndent("    ", "  ")
		enc.SetEscapeHTML(false)
		buf.WriteString("    ")
		if err := enc.Encode(m); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1) // the encoder's newline
		_, err := l.w.Write(buf.Bytes())
		return err
	case formatYAML:
		b, err := yaml.Marshal([]any{m})
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		if l.n == 0 {
			buf.WriteString(l.key + ":\n")
		}
		for line := range strings.Lines(string(b)) {
			buf.WriteString("    " + line)
		}
		_, err = l.w.Write(buf.Bytes())
		return err
	default:
		if l.tb == nil {
			l.tb = newTable(l.w, l.header...)
		}
		l.tb.row(row...)
		return nil
	}
}

// flushPage writes out the table rows of a page.
func (l *listWriter) flushPage() error {
	if l.tb == nil {
		return nil
	}
	return l.tb.flush()
}

// end ends the list, next the token of the rest ("" at the end).
func (l *listWriter) end(next string) error {
	more := ""
	if next != "" {
		more = fmt.Sprintf("(more: --page-token %s)\n", next)
	}
	return l.endWith(ordered{{"next_page_token", next}}, more)
}

// endWith ends the list with the keys of tail after its items (scalars),
// or, in a table, with the line more ("" for none).
func (l *listWriter) endWith(tail ordered, more string) error {
	var b strings.Builder
	switch l.f {
	case formatJSON:
		b.WriteString("\n  ],\n")
		if l.n == 0 {
			b.Reset()
			b.WriteString("{\n  " + jsonString(l.key) + ": [],\n")
		}
		for i, f := range tail {
			var v bytes.Buffer
			enc := json.NewEncoder(&v)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(f.value); err != nil {
				return err
			}
			b.WriteString("  " + jsonString(f.key) + ": " + strings.TrimSuffix(v.String(), "\n"))
			if i < len(tail)-1 {
				b.WriteString(",")
			}
			b.WriteString("\n")
		}
		b.WriteString("}\n")
	case formatYAML:
		if l.n == 0 {
			b.WriteString(l.key + ": []\n")
		}
		y, err := yaml.Marshal(tail)
		if err != nil {
			return err
		}
		b.Write(y)
	default:
		if l.tb == nil {
			l.tb = newTable(l.w, l.header...)
		}
		if err := l.tb.flush(); err != nil {
			return err
		}
		b.WriteString(more)
	}
	_, err := io.WriteString(l.w, b.String())
	return err
}

// jsonString is s as a JSON string, as the output writes it.
func jsonString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(buf.String(), "\n")
}
