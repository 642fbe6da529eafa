package docs

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/walcast/walcast/"

// listedPackage is one package of `go list`, with everything it and its
// tests import.
type listedPackage struct {
	path    string
	imports []string
}

// listPackages runs `go list` over the module: each package's imports,
// tests' included.
func listPackages(t *testing.T) []listedPackage {
	t.Helper()
	out := goList(t, "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, "./...")
	var pkgs []listedPackage
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		p := listedPackage{path: strings.TrimPrefix(f[0], module)}
		for _, imp := range f[1:] {
			if strings.HasPrefix(imp, module) {
				p.imports = append(p.imports, strings.TrimPrefix(imp, module))
			}
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// goList runs `go list args` in the module's root and returns its output.
func goList(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// under reports whether package path is dir or inside it.
func under(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// TestLayoutInternalIsAGroundFloor: the packages under internal/ are low
// helpers and test beds; none of them, tests included, imports the
// product's upper floors.
func TestLayoutInternalIsAGroundFloor(t *testing.T) {
	upper := []string{"broadcast", "server", "meta", "client", "node", "replicate", "cmd"}
	for _, p := range listPackages(t) {
		if !under(p.path, "internal") {
			continue
		}
		for _, imp := range p.imports {
			for _, u := range upper {
				if under(imp, u) {
					t.Errorf("%s imports %s: internal/ holds only what imports nothing above it", p.path, imp)
				}
			}
		}
	}
}

// TestLayoutOnlyBroadcastDrivesTheEngine: the decision core is imported by
// its driver (broadcast) and the packages under it (its simulator, its
// crash harness), by nothing else.
func TestLayoutOnlyBroadcastDrivesTheEngine(t *testing.T) {
	const engine = "broadcast/internal/engine"
	for _, p := range listPackages(t) {
		for _, imp := range p.imports {
			if imp == engine && !under(p.path, "broadcast") {
				t.Errorf("%s imports the engine: only broadcast and its simulator may", p.path)
			}
		}
	}
}

// deps lists the module's packages that pkg imports, directly or through
// others, its tests left out.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out := goList(t, "-deps", "-f", "{{.ImportPath}}", "./"+pkg)
	var in []string
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, module) {
			in = append(in, strings.TrimPrefix(p, module))
		}
	}
	return in
}

// TestLayoutMetaMeetsTheServerThroughApp: an application and the process
// meet in package app (what an application registers, what it is given);
// the server is the composition root that wires one in. So the reference
// application, meta, imports nothing of server, directly or through another
// package, and app imports neither of them. (meta's tests do run it in a
// real process, server.StartStandalone, as a user wires it.)
func TestLayoutMetaMeetsTheServerThroughApp(t *testing.T) {
	for pkg, banned := range map[string][]string{"meta": {"server"}, "app": {"server", "meta"}} {
		for _, d := range deps(t, pkg) {
			for _, b := range banned {
				if under(d, b) {
					t.Errorf("%s imports %s: it must meet the server through package app only", pkg, d)
				}
			}
		}
	}
}
