package debezium

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ParseProperties reads a Java .properties file (Kafka Connect's worker and
// connector configuration) as java.util.Properties.load does:
//
//   - a line whose first non-blank character is '#' or '!' is a comment;
//     blank lines are skipped;
//   - a line ending in an odd number of backslashes continues on the next
//     line, whose leading blanks (space, tab, form feed) are dropped;
//   - the key ends at the first unescaped '=', ':' or blank; blanks around the
//     separator are dropped, blanks at the end of the value are kept;
//   - \t \n \r \f and \uXXXX are escapes (a pair of \u escapes holding a
//     UTF-16 surrogate pair is one character), and a backslash before any
//     other character stands for that character;
//   - a later duplicate key replaces an earlier one.
//
// Kafka reads its .properties files as ISO-8859-1, as Properties.load does on
// an InputStream. Input that is valid UTF-8 is read as UTF-8 instead: a file
// written today is UTF-8, and for ASCII, which every Kafka and Debezium key
// and almost every value is, both read the same.
func ParseProperties(r io.Reader) (map[string]string, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read properties: %w", err)
	}
	text := string(raw)
	if !utf8.Valid(raw) {
		runes := make([]rune, len(raw))
		for i, b := range raw {
			runes[i] = rune(b)
		}
		text = string(runes)
	}
	props := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), len(text)+1)
	sc.Split(scanPropertyLines)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimLeft(sc.Text(), " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		first := lineNo
		// Join continuation lines. A comment marker on a continuation line is
		// part of the value: comments are recognised only at the start of a
		// logical line.
		for endsInOddBackslashes(line) {
			line = line[:len(line)-1]
			if !sc.Scan() {
				break // Java drops a backslash at the end of the input
			}
			lineNo++
			line += strings.TrimLeft(sc.Text(), " \t\f")
		}
		key, value, err := splitProperty(line)
		if err != nil {
			return nil, fmt.Errorf("properties line %d: %w", first, err)
		}
		props[key] = value
	}
	return props, nil
}

// scanPropertyLines splits at "\n", "\r\n" or a lone "\r", the three line
// terminators Properties accepts.
func scanPropertyLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	for i, c := range data {
		switch c {
		case '\n':
			return i + 1, data[:i], nil
		case '\r':
			if i+1 < len(data) {
				if data[i+1] == '\n' {
					return i + 2, data[:i], nil
				}
				return i + 1, data[:i], nil
			}
			if atEOF {
				return i + 1, data[:i], nil
			}
			return 0, nil, nil // need the next byte to tell \r from \r\n
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}

func endsInOddBackslashes(s string) bool {
	n := 0
	for i := len(s) - 1; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// splitProperty splits a logical line (leading blanks removed) into its
// unescaped key and value.
func splitProperty(line string) (key, value string, err error) {
	end := len(line) // end of the key
	escaped := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		if escaped {
			escaped = false
			continue
		}
		if c == '\\' {
			escaped = true
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f' {
			end = i
			break
		}
	}
	rest := strings.TrimLeft(line[end:], " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	if key, err = unescapeProperty(line[:end]); err != nil {
		return "", "", fmt.Errorf("key: %w", err)
	}
	if value, err = unescapeProperty(rest); err != nil {
		return "", "", fmt.Errorf("value of %q: %w", key, err)
	}
	return key, value, nil
}

func unescapeProperty(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	var high rune // a pending high surrogate from \uD8xx
	flush := func() {
		if high != 0 {
			b.WriteRune(utf8.RuneError)
			high = 0
		}
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			flush()
			b.WriteByte(c)
			continue
		}
		i++
		switch c = s[i]; c {
		case 't':
			flush()
			b.WriteByte('\t')
		case 'n':
			flush()
			b.WriteByte('\n')
		case 'r':
			flush()
			b.WriteByte('\r')
		case 'f':
			flush()
			b.WriteByte('\f')
		case 'u':
			if i+5 > len(s) {
				return "", fmt.Errorf(`malformed \uxxxx escape %q: want four hex digits after \u`, s[i-1:])
			}
			var r rune
			for _, h := range s[i+1 : i+5] {
				d := hexDigit(h)
				if d < 0 {
					return "", fmt.Errorf(`malformed \uxxxx escape %q: want four hex digits after \u`, s[i-1:i+5])
				}
				r = r<<4 | rune(d)
			}
			i += 4
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00:
				flush()
				high = r
			case utf16.IsSurrogate(r) && high != 0:
				b.WriteRune(utf16.DecodeRune(high, r))
				high = 0
			default:
				flush()
				b.WriteRune(r) // a lone low surrogate is written as U+FFFD
			}
		default:
			flush()
			b.WriteByte(c)
		}
	}
	flush()
	return b.String(), nil
}

func hexDigit(r rune) int {
	switch {
	case r >= '0' && r <= '9':
		return int(r - '0')
	case r >= 'a' && r <= 'f':
		return int(r-'a') + 10
	case r >= 'A' && r <= 'F':
		return int(r-'A') + 10
	}
	return -1
}

// FormatProperties writes props as a Java properties file that
// java.util.Properties.load reads back unchanged (ISO-8859-1, with \u escapes
// for the rest, UTF-16 surrogate pairs beyond U+FFFF), sorted by key so that
// the file is the same on every run: a password or DSN part with '\', '=',
// ':', '#', '!', a leading space or non-ASCII text reaches Java as it is.
// ParseProperties is its inverse.
func FormatProperties(props map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		b.WriteString(escapeProperty(k, true))
		b.WriteByte('=')
		b.WriteString(escapeProperty(props[k], false))
		b.WriteByte('\n')
	}
	return b.String()
}

func escapeProperty(s string, key bool) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == ' ' && (key || i == 0):
			b.WriteString(`\ `)
		case key && (r == '=' || r == ':' || r == '#' || r == '!'):
			b.WriteByte('\\')
			b.WriteRune(r)
		case !key && i == 0 && (r == '#' || r == '!'):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r > 0x7e:
			if hi, lo := utf16.EncodeRune(r); hi != utf8.RuneError {
				fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
