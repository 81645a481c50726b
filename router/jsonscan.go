package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// The JSON scanner of the headers column and of a logical message's content:
// one pass over input that json.Valid has accepted, so it checks no syntax of
// its own, and values share the input's bytes unless a string has escapes.
// FuzzAppendJSONHeaders holds it to encoding/json's reading of the same input.

// estimateHeaders guesses the number of entries in a headers object from its
// colons, so that the Headers slice is allocated once. Colons inside strings
// only make the guess too high, which is harmless.
func estimateHeaders(b []byte) int {
	n := 0
	for _, c := range b {
		if c == ':' {
			n++
		}
	}
	return n
}

// appendJSONHeaders appends the entries of the JSON object b in stored order:
// strings as their unescaped text, other values as their JSON text, nulls
// skipped. Values share b's bytes where no unescaping is needed.
func appendJSONHeaders(dst []Header, b []byte) ([]Header, error) {
	if !json.Valid(b) {
		return dst, errors.New("not valid JSON")
	}
	// json.Valid passes invalid UTF-8 inside strings, which unquote would hand on
	// as it is where a string has no escapes and encoding/json would turn into
	// U+FFFD where it has: refused, as the message source refuses such content.
	if !utf8.Valid(b) {
		return dst, errors.New("not valid UTF-8 (JSON is UTF-8)")
	}
	// b is valid JSON from here on, so the scanner below need not re-check it.
	i := skipSpace(b, 0)
	if b[i] != '{' {
		return dst, errors.New("not a JSON object")
	}
	i = skipSpace(b, i+1)
	if b[i] == '}' {
		return dst, nil
	}
	for {
		end := stringEnd(b, i)
		key, err := unquote(b[i:end])
		if err != nil {
			return dst, err
		}
		i = skipSpace(b, end)
		i = skipSpace(b, i+1) // ':'
		end = valueEnd(b, i)
		raw := b[i:end]
		switch raw[0] {
		case 'n': // null: no header
		case '"':
			v, err := unquote(raw)
			if err != nil {
				return dst, err
			}
			dst = append(dst, Header{Key: string(key), Value: v})
		default:
			dst = append(dst, Header{Key: string(key), Value: raw})
		}
		i = skipSpace(b, end)
		if b[i] == '}' {
			return dst, nil
		}
		i = skipSpace(b, i+1) // ','
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string starting at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the JSON value starting at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	default: // number, true, false, null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
			j++
		}
		return j
	}
}

// unquote returns the contents of the JSON string s, sharing s's bytes when it
// has no escapes.
func unquote(s []byte) ([]byte, error) {
	inner := s[1 : len(s)-1]
	for _, c := range inner {
		if c == '\\' {
			var out string
			if err := json.Unmarshal(s, &out); err != nil {
				return nil, fmt.Errorf("decode header string: %w", err)
			}
			return []byte(out), nil
		}
	}
	return inner, nil
}
