package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLayers holds the layering docs/architecture.md states: the top-level
// packages are the library, and none of them (nor their tests' non-test
// dependencies) imports internal/, so code outside this module can use them.
func TestLayers(t *testing.T) {
	const mod = "github.com/outbox-relay/outbox-relay/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], mod)
		if strings.HasPrefix(pkg, "internal/") || strings.HasPrefix(pkg, "cmd/") || strings.HasPrefix(pkg, "scripts/") || pkg == "deploy" {
			continue
		}
		checked++
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, mod+"internal/") || strings.HasPrefix(imp, mod+"cmd/") {
				t.Errorf("library package %s imports %s: the top-level packages must not depend on internal/ or cmd/ (docs/architecture.md#layers)", pkg, strings.TrimPrefix(imp, mod))
			}
		}
	}
	if checked < 7 {
		t.Fatalf("checked %d library packages; want at least event, backoff, replication, replication/pgslot, router, sink, checkpoint, sql", checked)
	}
}

// TestCommandsHoldNoLogic holds the rule of docs/contributing.md#where-a-change-goes:
// a command parses, calls a package and prints, so no file of this package
// but the tests speaks SQL or decodes the WAL.
func TestCommandsHoldNoLogic(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	sqlish := regexp.MustCompile("[`\"]\\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|CREATE|ALTER|SET) |pg_logical_slot_")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if sqlish.MatchString(line) && !strings.HasPrefix(strings.TrimSpace(line), "//") {
				t.Errorf("%s:%d: SQL in a command: %s; its logic belongs in the package that owns the concept (docs/contributing.md#where-a-change-goes)", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// maxFuncLines is docs/contributing.md's limit on a production function,
// from its func line to its closing brace: past it a function does several
// things, and its steps want names (issue 38).
const maxFuncLines = 100

// longFuncAllowed are the production functions still over maxFuncLines, with
// why. The list only shrinks: a function on it that is no longer long fails
// the test too, so that it is taken off.
var longFuncAllowed = map[string]string{}

// TestNoLongFunctions holds maxFuncLines over every production file of the
// module (not its tests, not the bench's nested module).
func TestNoLongFunctions(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	measured, long := 0, map[string]int{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			measured++
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				long[filepath.ToSlash(rel)+" "+funcName(fd)] = n
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if measured < 1000 {
		t.Fatalf("measured %d functions; want the module's (over a thousand): is the walk rooted at the module?", measured)
	}
	for name, n := range long {
		if _, ok := longFuncAllowed[name]; !ok {
			t.Errorf("%s is %d lines; split it into named steps of at most %d (docs/contributing.md)", name, n, maxFuncLines)
		}
	}
	for name := range longFuncAllowed {
		if _, ok := long[name]; !ok {
			t.Errorf("%s is on longFuncAllowed but no longer over %d lines (or gone): take it off", name, maxFuncLines)
		}
	}
}

// funcName is a function's name as "Recv.Name" for a method, else "Name".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if ix, ok := typ.(*ast.IndexExpr); ok {
		typ = ix.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
