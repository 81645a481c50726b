package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"unicode/utf8"
)

// referenceHeaders is encoding/json's reading of a headers object, in the
// scanner's terms: the entries in stored order (duplicates kept), strings as
// their decoded text, other values as their JSON text, nulls left out; ok is
// false when b is not a JSON object, or not UTF-8 (which encoding/json would
// alter, turning bytes into U+FFFD).
func referenceHeaders(b []byte) (hs []Header, ok bool) {
	if !json.Valid(b) || !utf8.Valid(b) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			panic(err) // b is valid JSON
		}
		key := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			panic(err)
		}
		switch raw[0] {
		case 'n':
		case '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				panic(err)
			}
			hs = append(hs, Header{Key: key, Value: []byte(s)})
		default:
			hs = append(hs, Header{Key: key, Value: raw})
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		panic(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		panic("valid JSON with more after the object")
	}
	return hs, true
}

// FuzzAppendJSONHeaders: the headers scanner never panics, refuses what is not
// a UTF-8 JSON object, and reads every object as encoding/json does (same entries,
// same order, same bytes), after what dst already held, with an estimate that
// never falls short. The seeds are the headers of the router's unit tests.
func FuzzAppendJSONHeaders(f *testing.F) {
	for _, s := range []string{
		// TestRoute, TestRouteHeadersColumn, TestRouteMessage
		`{"z": "last?", "a": "no, stored order"}`,
		`{"s": "text", "n": 42, "f": -1.5e2, "t": true, "o": {"x": [1, "}"]}, "l": [1, 2], "skip": null}`,
		`{"tr\"ace": "a\"b\u00e9\n"}`,
		` { } `,
		`{"e": ""}`,
		`{"id": "DUP", "x": "1"}`,
		`{"event_type": "X", "aggregate_type": "Y", "id": "", "id": "again"}`,
		`{"ID": "a", "id ": "b", "Id": "c"}`,
		`["a"]`, `"a"`, `42`, `null`, `{"a":`, ``,
		`{"x": "y", "id": "evil"}`,
		// the scanner's edges: escapes at a string's end, nesting with strings that close it,
		// numbers against delimiters, whitespace everywhere
		"{\"a\\\\\":\"\\\\\",\"b\":[\"]\",{\"}\":\"\\\"\"}]}",
		"\t{\r\n\"k\" :\t-0.0e+1 ,\"t\":false\n}\n",
		`{"\ud83d\ude00":"\u0000"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, ok := referenceHeaders(b)
		prefix := []Header{{Key: "field", Value: []byte("kept")}}
		got, err := appendJSONHeaders(prefix, b)
		if !ok {
			if err == nil {
				t.Fatalf("appendJSONHeaders(%q) = %q, nil; want an error: not a JSON object", b, got)
			}
			return
		}
		if err != nil {
			t.Fatalf("appendJSONHeaders(%q) = %v; want %q", b, err, want)
		}
		if len(got) == 0 || got[0].Key != "field" || string(got[0].Value) != "kept" {
			t.Fatalf("appendJSONHeaders(%q) lost the entries it was appended to: %q", b, got)
		}
		got = got[1:]
		if len(got) != len(want) {
			t.Fatalf("appendJSONHeaders(%q) = %q; want %q (encoding/json's reading)", b, got, want)
		}
		for i := range want {
			if got[i].Key != want[i].Key || !bytes.Equal(got[i].Value, want[i].Value) {
				t.Fatalf("appendJSONHeaders(%q)[%d] = %q=%q; want %q=%q (encoding/json's reading)",
					b, i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
			}
		}
		if n := estimateHeaders(b); n < len(got) {
			t.Errorf("estimateHeaders(%q) = %d; want at least the %d entries", b, n, len(got))
		}
	})
}
