package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A swagger document in the shape of Kubernetes': a kind, the definitions it
// refers to (one of them recursive), an int-or-string and a quantity.
const swagger = `{"definitions": {
  "io.k8s.api.apps.v1.Thing": {
    "type": "object",
    "properties": {
      "apiVersion": {"type": "string"},
      "kind": {"type": "string"},
      "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec", "description": "the spec"}
    },
    "x-kubernetes-group-version-kind": [{"group": "apps", "kind": "Thing", "version": "v1"}]
  },
  "io.k8s.api.apps.v1.ThingSpec": {
    "type": "object",
    "properties": {
      "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
      "memory": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"},
      "labels": {"type": "object", "additionalProperties": {"type": "string"}},
      "child": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec"}
    }
  },
  "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
  "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string", "description": "a quantity"},
  "io.k8s.api.core.v1.Unused": {"type": "object", "properties": {"a": {"type": "string"}}},
  "io.k8s.api.core.v1.Pod": {
    "type": "object",
    "properties": {"kind": {"type": "string"}},
    "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}]
  }
}}`

const crd = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names:
    kind: Widget
  versions:
    - name: v1
      served: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            apiVersion: {type: string}
            kind: {type: string}
            spec:
              type: object
              properties:
                port:
                  x-kubernetes-int-or-string: true
                free:
                  type: object
                  x-kubernetes-preserve-unknown-fields: true
                  properties:
                    known: {type: string}
    - name: v0
      served: false
      schema:
        openAPIV3Schema: {type: object}
`

func readSchema(t *testing.T, dir, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return m
}

func get(v any, path ...string) any {
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	return v
}

func TestRun(t *testing.T) {
	in := t.TempDir()
	out := t.TempDir()
	sw := filepath.Join(in, "swagger.json")
	cr := filepath.Join(in, "crd.yaml")
	os.WriteFile(sw, []byte(swagger), 0o644)
	os.WriteFile(cr, []byte(crd), 0o644)

	n, err := run(sw, []string{cr}, out)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("run wrote %d schemas; want 3 (thing-apps-v1, pod-v1, example.com/widget_v1)", n)
	}

	thing := readSchema(t, out, "thing-apps-v1.json")
	string_ := map[string]any{"type": "string"}
	oneOf := func(types ...string) []any {
		var l []any
		for _, ty := range types {
			l = append(l, map[string]any{"type": ty})
		}
		return l
	}
	checks := []struct {
		what string
		got  any
		want any
	}{
		{"root strict", get(thing, "additionalProperties"), false},
		{"apiVersion pinned", get(thing, "properties", "apiVersion", "enum"), []any{"apps/v1"}},
		{"kind pinned", get(thing, "properties", "kind", "enum"), []any{"Thing"}},
		{"spec ref kept local", get(thing, "properties", "spec", "$ref"), "#/definitions/io.k8s.api.apps.v1.ThingSpec"},
		{"spec strict", get(thing, "definitions", "io.k8s.api.apps.v1.ThingSpec", "additionalProperties"), false},
		{"map values stay free-form", get(thing, "definitions", "io.k8s.api.apps.v1.ThingSpec", "properties", "labels", "additionalProperties"), string_},
		{"int-or-string", get(thing, "definitions", "io.k8s.apimachinery.pkg.util.intstr.IntOrString", "oneOf"), oneOf("string", "integer")},
		{"quantity", get(thing, "definitions", "io.k8s.apimachinery.pkg.api.resource.Quantity", "oneOf"), oneOf("string", "number")},
		{"unreferenced definition left out", get(thing, "definitions", "io.k8s.api.core.v1.Unused"), nil},
	}
	pod := readSchema(t, out, "pod-v1.json")
	checks = append(checks, struct {
		what string
		got  any
		want any
	}{"core kind pinned", get(pod, "properties", "kind", "enum"), []any{"Pod"}})

	widget := readSchema(t, out, "example.com/widget_v1.json")
	checks = append(checks, []struct {
		what string
		got  any
		want any
	}{
		{"crd strict", get(widget, "properties", "spec", "additionalProperties"), false},
		{"crd int-or-string", get(widget, "properties", "spec", "properties", "port", "oneOf"), oneOf("string", "integer")},
		{"crd preserve-unknown-fields stays open", get(widget, "properties", "spec", "properties", "free", "additionalProperties"), nil},
		{"crd apiVersion pinned", get(widget, "properties", "apiVersion", "enum"), []any{"example.com/v1"}},
	}...)
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v; want %#v", c.what, c.got, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "example.com", "widget_v0.json")); err == nil {
		t.Errorf("a version that is not served got a schema")
	}
}

func TestRunRefusesEmptyInput(t *testing.T) {
	in := t.TempDir()
	sw := filepath.Join(in, "swagger.json")
	os.WriteFile(sw, []byte(`{"definitions": {"a.B": {"type": "object"}}}`), 0o644)
	_, err := run(sw, nil, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "no group/version/kind") {
		t.Errorf("run(no kinds) = %v; want an error saying no group/version/kind was found", err)
	}
}

func TestBuiltinFile(t *testing.T) {
	tests := []struct {
		k    gvk
		want string
	}{
		{gvk{"", "v1", "ConfigMap"}, "configmap-v1.json"},
		{gvk{"apps", "v1", "Deployment"}, "deployment-apps-v1.json"},
		{gvk{"networking.k8s.io", "v1", "Ingress"}, "ingress-networking-v1.json"},
	}
	for _, tt := range tests {
		if got := builtinFile(tt.k); got != tt.want {
			t.Errorf("builtinFile(%v) = %q; want %q", tt.k, got, tt.want)
		}
	}
}
