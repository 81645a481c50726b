package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/admin"
)

var update = flag.Bool("update", false, "rewrite the files generated from settings")

// The files generated from settings (go generate ./cmd/outbox-relay), and the
// markers between which the reference sits in docs/configuration.md.
const (
	examplePath   = repoRoot + "/config.example.yaml"
	referencePath = repoRoot + "/docs/configuration.md"
	refBegin      = "<!-- BEGIN reference: generated from cmd/outbox-relay/settings.go by go generate ./cmd/outbox-relay; edit the settings -->\n"
	refEnd        = "<!-- END reference -->\n"
)

// TestSettingsGenerated fails when config.example.yaml or the reference in
// docs/configuration.md differs from what settings make; go generate
// (go test -run TestSettingsGenerated -update) rewrites them.
func TestSettingsGenerated(t *testing.T) {
	doc, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(doc), refBegin)
	_, after, ok2 := strings.Cut(rest, refEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s lacks the markers of the generated reference:\n%s%s", referencePath, refBegin, refEnd)
	}
	for path, want := range map[string]string{
		examplePath:   exampleYAML(),
		referencePath: before + refBegin + referenceTables() + refEnd + after,
	} {
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) == want {
			continue
		}
		if *update {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("%s differs from what settings.go makes: run go generate ./cmd/outbox-relay and commit it", path)
	}
}

// groupOf is the reference's table a key is listed in.
func groupOf(key string) string {
	section, _, _ := strings.Cut(key, ".")
	switch {
	case strings.HasPrefix(key, "outbox.retention"):
		return "retention"
	case section == "pipeline" || section == "health" || section == "checkpoint":
		return "pipeline, health, checkpoint"
	case section == "metrics" || section == "tracing" || section == "log":
		return "metrics, tracing, log"
	}
	return section
}

// referenceTables is the reference: a table per group, a row per key.
func referenceTables() string {
	var b strings.Builder
	group := ""
	for _, s := range settings {
		if g := groupOf(s.key); g != group {
			group = g
			fmt.Fprintf(&b, "\n### %s\n\n| key | default | environment | what it is |\n| --- | --- | --- | --- |\n", g)
		}
		def := s.shown
		switch {
		case def != "":
		case s.def != "":
			def = "`" + s.def + "`"
		default:
			def = "none"
		}
		doc := s.doc
		if s.flag != "" {
			doc += ". Flag `--" + s.flag + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", s.key, def, envName(s.key), doc)
	}
	return b.String() + "\n"
}

var (
	mdLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)#]*)[^)]*\)`)
	// A YAML plain scalar may not hold these; such values are quoted.
	yamlSpecial = regexp.MustCompile(`^$|^[-?:,\[\]{}#&*!|>'"%@` + "`" + `]|[{}\[\],#]|: `)
)

const exampleHeader = `# outbox-relay configuration. Every key is shown with its default; the two
# without one (postgres.dsn, kafka.brokers) must be set.
#
# Generated from cmd/outbox-relay/settings.go (go generate ./cmd/outbox-relay);
# docs/configuration.md has the same text with links.
#
# Each key can also be set in the environment: RELAY_ + the key in upper case
# with dots as underscores, e.g. RELAY_POSTGRES_DSN, RELAY_KAFKA_BROKERS
# (comma-separated), RELAY_TOPICS_OVERRIDES (Order=orders,Payment=payments).
# Flags override the environment, which overrides this file. Unknown keys are
# an error, so that a typo cannot be ignored silently.
`

// exampleYAML is config.example.yaml: every key but the ignored ones, with
// its default (or an example where there is none) and its doc as a comment.
func exampleYAML() string {
	var b strings.Builder
	b.WriteString(exampleHeader)
	var open []string // the sections of the last key written
	for _, s := range settings {
		if s.kind == ignored {
			continue
		}
		parts := strings.Split(s.key, ".")
		sections := parts[:len(parts)-1]
		same := 0
		for same < len(open) && same < len(sections) && open[same] == sections[same] {
			same++
		}
		for i := same; i < len(sections); i++ {
			if i == 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "%s%s:\n", strings.Repeat("  ", i), sections[i])
		}
		open = sections
		indent := strings.Repeat("  ", len(sections))
		comment := mdLink.ReplaceAllString(s.doc, "$1, docs/$2")
		if !strings.HasPrefix(comment, "`") { // a value keeps its case
			comment = strings.ToUpper(comment[:1]) + comment[1:]
		}
		comment = strings.ReplaceAll(comment, "`", "") + "."
		for _, line := range admin.WrapWords(comment, 78-len(indent)-2) {
			fmt.Fprintf(&b, "%s# %s\n", indent, line)
		}
		name := parts[len(parts)-1]
		switch {
		case s.isMap():
			fmt.Fprintf(&b, "%s%s: {}\n", indent, name)
		case s.kind == list && s.example != "":
			fmt.Fprintf(&b, "%s%s:\n%s  - %s\n", indent, name, indent, s.example)
		default:
			v := s.def
			if s.example != "" {
				v = s.example
			}
			if yamlSpecial.MatchString(v) {
				v = fmt.Sprintf("%q", v)
			}
			fmt.Fprintf(&b, "%s%s: %s\n", indent, name, v)
		}
	}
	return b.String()
}
