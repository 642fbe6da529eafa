//go:build ignore

// longtests prints, for each package with long tests (those whose body
// calls longtest.Require), a line "<package dir> <-run regexp>": .ci/run
// runs them in a step of their own with WALCAST_LONG_TESTS=1.
//
//	go run .ci/longtests.go
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	byDir := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			long := false
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "Require" {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "longtest" {
						long = true
					}
				}
				return !long
			})
			if long {
				dir := "./" + filepath.ToSlash(filepath.Dir(path))
				byDir[dir] = append(byDir[dir], fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "longtests:", err)
		os.Exit(1)
	}
	dirs := make([]string, 0, len(byDir))
	for d := range byDir {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		tests := byDir[d]
		slices.Sort(tests)
		fmt.Printf("%s ^(%s)$\n", d, strings.Join(tests, "|"))
	}
}
