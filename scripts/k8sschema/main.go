// Command k8sschema writes the JSON schemas that kubeconform validates
// Kubernetes manifests against, from sources that the Go module proxy serves:
// the OpenAPI v2 document of a Kubernetes release (api/openapi-spec/swagger.json
// in the k8s.io/kubernetes module) and CustomResourceDefinition YAML files
// (such as prometheus-operator's ServiceMonitor). kubeconform's own default
// downloads them from GitHub, which CI cannot reach.
//
// Invariants of what it writes, which scripts/validate-deploy.sh relies on:
//
//   - one file per group/version/kind, self-contained: every $ref points into
//     the file's own "definitions", so kubeconform never fetches anything;
//   - strict: an object schema with properties and no additionalProperties
//     gets additionalProperties: false, so a misspelt field is an error (as
//     kubectl's own validation would say), unless the schema says it keeps
//     unknown fields (x-kubernetes-preserve-unknown-fields);
//   - apiVersion and kind are pinned by enum to the file's own;
//   - the API server's lenient scalars are allowed: int-or-string fields take
//     a string or an integer, resource quantities a string or a number.
//
// Built-in kinds are written as <kind>-<group's first label>-<version>.json
// (v1 kinds as <kind>-v1.json), the layout of kubeconform's default schema
// location; custom resources as <group>/<kind>_<version>.json, the layout of
// the common CRD catalogs. Point kubeconform at both:
//
//	-schema-location 'DIR/{{ .ResourceKind }}{{ .KindSuffix }}.json'
//	-schema-location 'DIR/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json'
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

func main() {
	swagger := flag.String("swagger", "", "OpenAPI v2 document of a Kubernetes release (swagger.json)")
	out := flag.String("out", "", "directory to write the schemas to (created)")
	var crds multiFlag
	flag.Var(&crds, "crd", "CustomResourceDefinition YAML file (repeatable)")
	flag.Parse()
	if *out == "" || (*swagger == "" && len(crds) == 0) {
		fmt.Fprintln(os.Stderr, "usage: k8sschema -out DIR [-swagger swagger.json] [-crd crd.yaml]...")
		os.Exit(2)
	}
	n, err := run(*swagger, crds, *out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sschema:", err)
		os.Exit(1)
	}
	fmt.Printf("k8sschema: %d schemas in %s\n", n, *out)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func run(swaggerPath string, crdPaths []string, out string) (int, error) {
	files := map[string][]byte{}
	if swaggerPath != "" {
		b, err := os.ReadFile(swaggerPath)
		if err != nil {
			return 0, err
		}
		if err := fromSwagger(b, files); err != nil {
			return 0, fmt.Errorf("%s: %w", swaggerPath, err)
		}
	}
	for _, p := range crdPaths {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		if err := fromCRDs(b, files); err != nil {
			return 0, fmt.Errorf("%s: %w", p, err)
		}
	}
	if len(files) == 0 {
		// An empty schema directory would make every document "schema not
		// found", which is loud; but an empty input is a mistake to name here.
		return 0, errors.New("no group/version/kind found in the inputs")
	}
	for name, b := range files {
		p := filepath.Join(out, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return 0, err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return 0, err
		}
	}
	return len(files), nil
}

// quantityDef is declared a string but also read from a number.
const quantityDef = "io.k8s.apimachinery.pkg.api.resource.Quantity"

type gvk struct{ Group, Version, Kind string }

func (g gvk) apiVersion() string {
	if g.Group == "" {
		return g.Version
	}
	return g.Group + "/" + g.Version
}

// fromSwagger adds a schema per group/version/kind of an OpenAPI v2 document.
func fromSwagger(doc []byte, files map[string][]byte) error {
	var spec struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := decodeJSON(doc, &spec); err != nil {
		return err
	}
	if len(spec.Definitions) == 0 {
		return errors.New("no definitions: not an OpenAPI v2 document")
	}
	names := make([]string, 0, len(spec.Definitions))
	for n := range spec.Definitions {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		def := spec.Definitions[name]
		for _, k := range gvks(def) {
			defs := map[string]any{}
			if err := collect(def, spec.Definitions, defs); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			root := strict(rewriteRefs(deepCopy(def))).(map[string]any)
			for n, d := range defs {
				defs[n] = strict(rewriteRefs(laxScalar(n, deepCopy(d))))
			}
			if len(defs) > 0 {
				root["definitions"] = defs
			}
			pin(root, k)
			name := builtinFile(k)
			if err := add(files, name, root); err != nil {
				return err
			}
		}
	}
	return nil
}

// builtinFile is kubeconform's {{ .ResourceKind }}{{ .KindSuffix }}.json.
func builtinFile(k gvk) string {
	suffix := "-" + strings.ToLower(k.Version)
	if k.Group != "" {
		suffix = "-" + strings.ToLower(strings.Split(k.Group, ".")[0]) + suffix
	}
	return strings.ToLower(k.Kind) + suffix + ".json"
}

// add refuses two kinds that map to one file name, which would validate one
// kind against the other's schema.
func add(files map[string][]byte, name string, schema map[string]any) error {
	b, err := json.Marshal(schema)
	if err != nil {
		return err
	}
	if old, ok := files[name]; ok && !bytes.Equal(old, b) {
		return fmt.Errorf("two different schemas for %s", name)
	}
	files[name] = b
	return nil
}

func gvks(def map[string]any) []gvk {
	list, _ := def["x-kubernetes-group-version-kind"].([]any)
	var out []gvk
	for _, e := range list {
		m, _ := e.(map[string]any)
		g, _ := m["group"].(string)
		v, _ := m["version"].(string)
		k, _ := m["kind"].(string)
		if v != "" && k != "" {
			out = append(out, gvk{g, v, k})
		}
	}
	return out
}

// collect adds to defs every definition reachable from node through $ref.
func collect(node any, all map[string]map[string]any, defs map[string]any) error {
	switch n := node.(type) {
	case map[string]any:
		if ref, ok := n["$ref"].(string); ok {
			name, found := strings.CutPrefix(ref, "#/definitions/")
			if !found {
				return fmt.Errorf("$ref %q: only local definitions are supported", ref)
			}
			if _, seen := defs[name]; !seen {
				d, ok := all[name]
				if !ok {
					return fmt.Errorf("$ref %q: no such definition", ref)
				}
				defs[name] = d
				if err := collect(d, all, defs); err != nil {
					return err
				}
			}
		}
		for _, v := range n {
			if err := collect(v, all, defs); err != nil {
				return err
			}
		}
	case []any:
		for _, v := range n {
			if err := collect(v, all, defs); err != nil {
				return err
			}
		}
	}
	return nil
}

// rewriteRefs makes $refs point into the file's own definitions. The
// swagger's "#/definitions/X" already does; the copy keeps it that way and
// drops the sibling keywords that draft-04 validators would ignore anyway.
func rewriteRefs(node any) any {
	switch n := node.(type) {
	case map[string]any:
		if ref, ok := n["$ref"].(string); ok {
			out := map[string]any{"$ref": ref}
			if d, ok := n["description"]; ok {
				out["description"] = d
			}
			return out
		}
		for k, v := range n {
			n[k] = rewriteRefs(v)
		}
	case []any:
		for i, v := range n {
			n[i] = rewriteRefs(v)
		}
	}
	return node
}

// laxScalar gives resource quantities the types the API server accepts:
// 1 or "100m" for a CPU. (int-or-string fields carry a format that strict
// handles wherever it appears.)
func laxScalar(name string, def any) any {
	if name != quantityDef {
		return def
	}
	out := map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	if m, ok := def.(map[string]any); ok && m["description"] != nil {
		out["description"] = m["description"]
	}
	return out
}

// strict forbids properties a schema does not declare, and turns the
// OpenAPI v3 int-or-string marker (CRDs) into the types it stands for.
func strict(node any) any {
	switch n := node.(type) {
	case map[string]any:
		for k, v := range n {
			n[k] = strict(v)
		}
		if b, _ := n["x-kubernetes-int-or-string"].(bool); b {
			delete(n, "type")
			n["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		if n["format"] == "int-or-string" {
			delete(n, "type")
			delete(n, "format")
			n["oneOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		_, hasProps := n["properties"]
		_, hasAdditional := n["additionalProperties"]
		keep, _ := n["x-kubernetes-preserve-unknown-fields"].(bool)
		if hasProps && !hasAdditional && !keep {
			n["additionalProperties"] = false
		}
	case []any:
		for i, v := range n {
			n[i] = strict(v)
		}
	}
	return node
}

// pin restricts apiVersion and kind to the schema's own, so that a document
// cannot pass against the schema of a kind it is not.
func pin(root map[string]any, k gvk) {
	props, _ := root["properties"].(map[string]any)
	if props == nil {
		return
	}
	if _, ok := props["apiVersion"]; ok {
		props["apiVersion"] = map[string]any{"type": "string", "enum": []any{k.apiVersion()}}
	}
	if _, ok := props["kind"]; ok {
		props["kind"] = map[string]any{"type": "string", "enum": []any{k.Kind}}
	}
}

// fromCRDs adds a schema per served version of each CustomResourceDefinition
// in a (multi-document) YAML file.
func fromCRDs(doc []byte, files map[string][]byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(doc))
	found := 0
	for {
		var crd struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Group string `yaml:"group"`
				Names struct {
					Kind string `yaml:"kind"`
				} `yaml:"names"`
				Versions []struct {
					Name   string `yaml:"name"`
					Served bool   `yaml:"served"`
					Schema struct {
						OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
					} `yaml:"schema"`
				} `yaml:"versions"`
			} `yaml:"spec"`
		}
		err := dec.Decode(&crd)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if crd.Kind != "CustomResourceDefinition" {
			continue
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema.OpenAPIV3Schema == nil {
				continue
			}
			root, ok := strict(v.Schema.OpenAPIV3Schema).(map[string]any)
			if !ok {
				return fmt.Errorf("%s %s: schema is not an object", crd.Spec.Names.Kind, v.Name)
			}
			k := gvk{crd.Spec.Group, v.Name, crd.Spec.Names.Kind}
			pin(root, k)
			name := k.Group + "/" + strings.ToLower(k.Kind) + "_" + k.Version + ".json"
			if err := add(files, name, root); err != nil {
				return err
			}
			found++
		}
	}
	if found == 0 {
		return errors.New("no served CustomResourceDefinition version with a schema")
	}
	return nil
}

func decodeJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // keep integer bounds exact
	return d.Decode(v)
}

func deepCopy(v any) any {
	switch n := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(n))
		for k, e := range n {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(n))
		for i, e := range n {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}
