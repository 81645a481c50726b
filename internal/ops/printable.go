package ops

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Printable makes s safe to show on an operator's terminal. Text in the
// outbox, the retry table, the catalog and server messages is written by
// applications and other clients: an aggregate type "\x1b[2J" would clear the
// screen, a CR would overwrite a line, a bidi override would reorder it. Every
// C0 control (newline and tab included), DEL, C1 control, Unicode line and
// paragraph separator, bidi control and invalid UTF-8 byte is written as a Go
// escape, the way strconv.Quote spells it (\x1b, \r, \a, \u0085, \u202e,
// \xff); all other text, non-ASCII letters and emoji included, is kept as is,
// and so is the backslash, so that JSON payloads and error messages read
// naturally. Machine output (--json) needs none of this: JSON escapes controls.
func Printable(s string) string {
	if isPrintable(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case unsafeRune(r):
			q := strconv.QuoteRuneToASCII(r) // '\x1b', '\r', '\u0085'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// PrintableText is Printable for text of several lines (joined errors, a
// multi-line message): line breaks are kept, everything else is escaped.
func PrintableText(s string) string {
	if isPrintable(strings.ReplaceAll(s, "\n", "")) {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Printable(l)
	}
	return strings.Join(lines, "\n")
}

func isPrintable(s string) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || unsafeRune(r) {
			return false
		}
		i += n
	}
	return true
}

// unsafeRune reports runes that a terminal interprets instead of showing.
func unsafeRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, 0x80 <= r && r <= 0x9f: // C0, DEL, C1
		return true
	case r == 0x2028, r == 0x2029: // line and paragraph separators
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, 0x202a <= r && r <= 0x202e, 0x2066 <= r && r <= 0x2069: // bidi controls
		return true
	}
	return false
}
