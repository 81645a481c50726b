package main

import (
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
