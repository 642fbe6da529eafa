package docs

import (
	"fmt"
	"html"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The package diagram at the top of design.md: the module's packages and
// what each imports, drawn from `go list` (tests left out). Generated code
// (api/) and the helpers under internal/ are left out: every package may use
// internal/, which imports nothing above it (TestLayoutInternalIsAGroundFloor),
// and api/ is the protobuf code of the API. So are the test beds
// (catalogtest, waltest, apitest) and this package. An edge is drawn only
// where no longer path says the same (a transitive reduction), and each
// package sits one row above the highest package it imports.

const diagramFile = "packages.svg"

// omitted reports whether the diagram leaves package p out.
func omitted(p string) bool {
	return under(p, "internal") || under(p, "api") || p == "docs" ||
		strings.HasSuffix(p, "catalogtest") || strings.HasSuffix(p, "waltest") || strings.HasSuffix(p, "apitest")
}

// importGraph is the module's packages and their own imports (no tests')
// within the module, omitted packages left out.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	out := goList(t, "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[0], module)
		if p == strings.TrimSuffix(module, "/") || omitted(p) {
			continue
		}
		g[p] = nil
		for _, imp := range f[1:] {
			if q, ok := strings.CutPrefix(imp, module); ok && !omitted(q) {
				g[p] = append(g[p], q)
			}
		}
	}
	return g
}

// reduce keeps an edge p -> q only when no other import of p reaches q.
func reduce(g map[string][]string) map[string][]string {
	reach := map[string]map[string]bool{}
	var walk func(p string) map[string]bool
	walk = func(p string) map[string]bool {
		if r, ok := reach[p]; ok {
			return r
		}
		r := map[string]bool{}
		reach[p] = r
		for _, q := range g[p] {
			r[q] = true
			for x := range walk(q) {
				r[x] = true
			}
		}
		return r
	}
	out := map[string][]string{}
	for p, qs := range g {
		out[p] = []string{}
		for _, q := range qs {
			indirect := false
			for _, o := range qs {
				if o != q && walk(o)[q] {
					indirect = true
					break
				}
			}
			if !indirect {
				out[p] = append(out[p], q)
			}
		}
		sort.Strings(out[p])
	}
	return out
}

// rows places each package one row above the highest it imports (row 0:
// those that import none), each row ordered to keep edges short: by the
// mean position of what its packages import, a few sweeps over the rows.
func rows(g map[string][]string) [][]string {
	level := map[string]int{}
	var lv func(p string) int
	lv = func(p string) int {
		if l, ok := level[p]; ok {
			return l
		}
		l := 0
		for _, q := range g[p] {
			l = max(l, lv(q)+1)
		}
		level[p] = l
		return l
	}
	var out [][]string
	for p := range g {
		l := lv(p)
		for len(out) <= l {
			out = append(out, nil)
		}
		out[l] = append(out[l], p)
	}
	for _, r := range out {
		sort.Strings(r)
	}
	pos := func() map[string]float64 {
		m := map[string]float64{}
		for _, r := range out {
			for i, p := range r {
				m[p] = (float64(i) + 0.5) / float64(len(r))
			}
		}
		return m
	}
	importers := map[string][]string{}
	for p, qs := range g {
		for _, q := range qs {
			importers[q] = append(importers[q], p)
		}
	}
	for range 4 {
		for _, neighbours := range []map[string][]string{g, importers} {
			at := pos()
			for _, r := range out {
				key := map[string]float64{}
				for _, p := range r {
					key[p] = at[p]
					if ns := neighbours[p]; len(ns) > 0 {
						sum := 0.0
						for _, n := range ns {
							sum += at[n]
						}
						key[p] = sum / float64(len(ns))
					}
				}
				slices.SortStableFunc(r, func(a, b string) int {
					switch {
					case key[a] < key[b]:
						return -1
					case key[a] > key[b]:
						return 1
					}
					return strings.Compare(a, b)
				})
			}
		}
	}
	return out
}

// diagramSVG draws the rows, the highest at the top, with an arrow from
// each package to each it imports.
func diagramSVG(g map[string][]string, rs [][]string) string {
	const (
		charW, boxH, padX = 7, 24, 10
		gapX, gapY, top   = 16, 56, 36
	)
	width := 0
	rowW := make([]int, len(rs))
	for i, r := range rs {
		for _, p := range r {
			rowW[i] += len(p)*charW + 2*padX + gapX
		}
		width = max(width, rowW[i])
	}
	width += 2 * gapX
	height := top + len(rs)*(boxH+gapY)
	type box struct{ x, y, w int }
	boxes := map[string]box{}
	for i, r := range rs {
		y := top + (len(rs)-1-i)*(boxH+gapY)
		x := (width - rowW[i] + gapX) / 2
		for _, p := range r {
			w := len(p)*charW + 2*padX
			boxes[p] = box{x, y, w}
			x += w + gapX
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="monospace" font-size="12">`+"\n", width, height, width, height)
	b.WriteString(`<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#8a8a8a"/></marker></defs>` + "\n")
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	b.WriteString(`<text x="10" y="20" fill="#444">walcast's packages: an arrow from each to those it imports (generated from go list by docs/packages_test.go)</text>` + "\n")
	var names []string
	for p := range g {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		from := boxes[p]
		for _, q := range g[p] {
			to := boxes[q]
			x1, y1 := from.x+from.w/2, from.y+boxH
			x2, y2 := to.x+to.w/2, to.y
			fmt.Fprintf(&b, `<path d="M%d,%d C%d,%d %d,%d %d,%d" fill="none" stroke="#8a8a8a" stroke-width="1" marker-end="url(#arrow)"/>`+"\n",
				x1, y1, x1, y1+gapY/2, x2, y2-gapY/2, x2, y2)
		}
	}
	for _, p := range names {
		bx := boxes[p]
		fill := "#eef3fb"
		if strings.Contains(p, "/internal/") {
			fill = "#f4f4f4"
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" rx="4" fill="%s" stroke="#4a6fa5"/>`+"\n", bx.x, bx.y, bx.w, boxH, fill)
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", bx.x+bx.w/2, bx.y+boxH/2+4, html.EscapeString(p))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// TestPackageDiagram: packages.svg is the diagram of the packages as they
// import each other now. Run with -update to draw it again.
func TestPackageDiagram(t *testing.T) {
	g := reduce(importGraph(t))
	got, err := os.ReadFile(diagramFile)
	if err != nil && !*update {
		t.Fatal(err)
	}
	generated(t, diagramFile, string(got), diagramSVG(g, rows(g)), "does not show the packages as they import each other", "TestPackageDiagram")
}
