package router

import (
	"fmt"
	"strconv"
	"strings"
)

// translateJavaRegex rewrites a java.util.regex pattern (Debezium's
// route.topic.regex) into Go's RE2 syntax with the same matches, or refuses
// it naming the construct. Go accepts much of Java's syntax but reads some
// of it otherwise, silently routing to other topics:
//
//   - \s, \v, \h and Java's POSIX classes \p{Alpha} and the like are
//     rewritten as the ASCII classes Java means (Java's \s has \x0B, Go's
//     has not; Go's \v is one character, Java's a class); '.' excludes
//     Java's line terminators (\r, \u0085, \u2028, \u2029 as well as \n);
//     \uXXXX, \e and octal \0nn become \x{...}.
//   - (?i) is ASCII-only in Java (Go folds Unicode: K matches the Kelvin
//     sign): a letter under it becomes [aA].
//
// Refused, each named: character-class intersection (&&) and nested classes
// ([a[b]], [[:alpha:]], which Go reads as a POSIX class), possessive
// quantifiers (a*+), lookaround and atomic groups, backreferences, \b and \B
// (Java's word boundary counts non-ASCII letters), \R \X \G \Z \c, the
// flags d m u x U c (U is "ungreedy" in Go), (?i) inside a character class,
// negated Java classes inside a character class (\S, \P{Alpha}), and
// \p{...} names that are not Unicode general categories.
func translateJavaRegex(re string) (string, error) {
	var b strings.Builder
	type flags struct{ i, s bool }
	stack := []flags{{}} // the flags of each open group; the last is in force
	cur := func() *flags { return &stack[len(stack)-1] }
	refuse := func(construct, why string) (string, error) {
		return "", fmt.Errorf("%s is Java syntax that Go reads otherwise or not at all (%s): rewrite the expression without it, or route these aggregate types with topics.overrides", construct, why)
	}
	inClass := false
	classStart := 0
	for i := 0; i < len(re); i++ {
		c := re[i]
		switch {
		case c == '\\':
			if i+1 >= len(re) {
				return refuse(`a trailing \`, "an incomplete escape")
			}
			e := re[i+1]
			i++
			switch e {
			case 'Q':
				end := strings.Index(re[i+1:], `\E`)
				lit := re[i+1:]
				if end >= 0 {
					lit = re[i+1 : i+1+end]
					i += end + 2
				} else {
					i = len(re)
				}
				for _, r := range lit {
					writeLiteral(&b, r, cur().i && !inClass)
				}
			case 's':
				b.WriteString(classOf(`\t\n\x0B\f\r `, inClass, false))
			case 'S':
				if inClass {
					return refuse(`\S inside a character class`, "Java's excludes \\x0B, Go's does not")
				}
				b.WriteString(classOf(`\t\n\x0B\f\r `, false, true))
			case 'v', 'V':
				if inClass && e == 'V' {
					return refuse(`\V inside a character class`, "a negated Java class")
				}
				b.WriteString(classOf(`\n\x0B\f\r\x{85}\x{2028}\x{2029}`, inClass, e == 'V'))
			case 'h', 'H':
				if inClass && e == 'H' {
					return refuse(`\H inside a character class`, "a negated Java class")
				}
				b.WriteString(classOf(`\t \x{A0}\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}`, inClass, e == 'H'))
			case 'p', 'P':
				name := ""
				switch {
				case i+1 < len(re) && re[i+1] == '{':
					end := strings.IndexByte(re[i+1:], '}')
					if end < 0 {
						return refuse(`\`+string(e)+"{", "an unclosed property")
					}
					name = re[i+2 : i+1+end]
					i += end + 1
				case i+1 < len(re):
					name = re[i+1 : i+2]
					i++
				}
				if set, ok := javaPOSIX[name]; ok {
					if inClass && e == 'P' {
						return refuse(`\P{`+name+`} inside a character class`, "a negated Java class")
					}
					b.WriteString(classOf(set, inClass, e == 'P'))
				} else if generalCategory[name] {
					b.WriteString(`\` + string(e) + "{" + name + "}")
				} else {
					return refuse(`\`+string(e)+"{"+name+"}", "not a Unicode general category Go knows by that name")
				}
			case 'u':
				if i+4 >= len(re) {
					return refuse(`\u`, "an incomplete escape")
				}
				v, err := strconv.ParseUint(re[i+1:i+5], 16, 32)
				if err != nil {
					return refuse(`\u`+re[i+1:i+5], "not four hex digits")
				}
				i += 4
				writeLiteral(&b, rune(v), cur().i && !inClass)
			case 'e':
				b.WriteString(`\x{1B}`)
			case '0':
				j := i + 1
				for j < len(re) && j < i+4 && re[j] >= '0' && re[j] <= '7' {
					j++
				}
				v, err := strconv.ParseUint(re[i+1:j], 8, 32)
				if err != nil || v > 0377 {
					return refuse(`\0`+re[i+1:j], "an octal escape needs one to three octal digits up to 0377")
				}
				b.WriteString(fmt.Sprintf(`\x{%X}`, v))
				i = j - 1
			case 'b', 'B':
				if inClass && e == 'b' {
					return refuse(`\b inside a character class`, "Java refuses it")
				}
				return refuse(`\`+string(e), "Java's word boundary counts non-ASCII letters and digits as word characters, Go's only ASCII ones")
			case 'R', 'X', 'G', 'Z', 'c', 'k':
				return refuse(`\`+string(e), "Go has no such escape, or reads it otherwise")
			case '1', '2', '3', '4', '5', '6', '7', '8', '9':
				return refuse(`\`+string(e), "a backreference")
			default:
				if e >= 'a' && e <= 'z' || e >= 'A' && e <= 'Z' {
					// \d \D \w \W \t \n \r \f \a \x \A \z: the same in both.
					if !strings.ContainsRune("dDwWtnrfaxAz", rune(e)) {
						return refuse(`\`+string(e), "not an escape both read alike")
					}
				}
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		case inClass:
			switch {
			case c == '[':
				return refuse("[ inside a character class", "Java reads a nested class or union ([a[bc]], [[:alpha:]] is the characters :alph), Go a literal or a POSIX class")
			case c == '&' && i+1 < len(re) && re[i+1] == '&':
				return refuse("&& inside a character class", "Java's class intersection; Go reads two '&' characters")
			case c == ']' && i > classStart:
				inClass = false
				b.WriteByte(c)
			case c == ']':
				return refuse("] first in a character class", "Java and Go read it otherwise")
			default:
				if cur().i && isASCIILetter(c) {
					return refuse("a letter in a character class under (?i)", "Java's case-insensitive match is ASCII-only, Go's Unicode; write both cases ([aAbB])")
				}
				b.WriteByte(c)
			}
		case c == '[':
			inClass = true
			b.WriteByte(c)
			classStart = i + 1
			if i+1 < len(re) && re[i+1] == '^' {
				b.WriteByte('^')
				i++
				classStart = i + 1
			}
		case c == '.':
			if cur().s {
				b.WriteString(`(?s:.)`)
			} else {
				b.WriteString(`[^\n\r\x{85}\x{2028}\x{2029}]`)
			}
		case c == '(':
			rest := re[i+1:]
			switch {
			case strings.HasPrefix(rest, "?="), strings.HasPrefix(rest, "?!"), strings.HasPrefix(rest, "?<="), strings.HasPrefix(rest, "?<!"):
				return refuse("("+rest[:min(len(rest), 3)], "lookaround")
			case strings.HasPrefix(rest, "?>"):
				return refuse("(?>", "an atomic group")
			case strings.HasPrefix(rest, "?<"), strings.HasPrefix(rest, "?:"), !strings.HasPrefix(rest, "?"):
				stack = append(stack, *cur())
				b.WriteByte('(')
			default: // (?flags) or (?flags:
				j := 1
				for j < len(rest) && rest[j] != ')' && rest[j] != ':' {
					j++
				}
				if j >= len(rest) {
					return refuse("(?"+rest[1:], "an unclosed group")
				}
				f := *cur()
				on := true
				for _, fc := range rest[1:j] {
					switch fc {
					case '-':
						on = false
					case 'i':
						f.i = on
					case 's':
						f.s = on
					default:
						return refuse("the flag "+string(fc)+" in (?"+rest[1:j]+")", "Java's d (UNIX_LINES), m (its line terminators), u (Unicode case), x (comments), U (Unicode classes: Go's U is ungreedy) and c differ in Go")
					}
				}
				if rest[j] == ')' {
					*cur() = f // to the end of the enclosing group
				} else {
					stack = append(stack, f)
					b.WriteString("(?:")
				}
				i += j + 1
			}
		case c == ')':
			if len(stack) > 1 {
				stack = stack[:len(stack)-1]
			}
			b.WriteByte(c)
		case c == '*' || c == '+' || c == '?' || c == '}':
			b.WriteByte(c)
			if i+1 < len(re) && re[i+1] == '+' {
				return refuse("the possessive quantifier "+string(c)+"+", "Go has no possessive quantifiers")
			}
		default:
			if cur().i && isASCIILetter(c) {
				writeLiteral(&b, rune(c), true)
			} else {
				b.WriteByte(c)
			}
		}
	}
	return b.String(), nil
}

// javaPOSIX are Java's POSIX character classes (US-ASCII only, Java's
// default) as the members of a Go class.
var javaPOSIX = map[string]string{
	"Lower": `a-z`, "Upper": `A-Z`, "ASCII": `\x00-\x7F`, "Alpha": `a-zA-Z`, "Digit": `0-9`, "Alnum": `a-zA-Z0-9`,
	"Punct": `!-/:-@\[-` + "`" + `{-~`, "Graph": `!-~`, "Print": ` -~`, "Blank": ` \t`, "Cntrl": `\x00-\x1F\x7F`,
	"XDigit": `0-9a-fA-F`, "Space": `\t\n\x0B\f\r `,
}

// generalCategory are the Unicode general categories both read alike.
var generalCategory = map[string]bool{}

func init() {
	for _, c := range strings.Fields("L Lu Ll Lt Lm Lo M Mn Mc Me N Nd Nl No P Pc Pd Ps Pe Pi Pf Po S Sm Sc Sk So Z Zs Zl Zp C Cc Cf Co Cs") {
		generalCategory[c] = true
	}
}

// classOf is a class of members: bare inside a class, else bracketed
// (negated when not).
func classOf(members string, inClass, not bool) string {
	switch {
	case inClass:
		return members
	case not:
		return "[^" + members + "]"
	}
	return "[" + members + "]"
}

func isASCIILetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// writeLiteral writes r as a Go literal: quoted, and as [xX] for an ASCII
// letter under Java's (ASCII-only) case-insensitive flag.
func writeLiteral(b *strings.Builder, r rune, fold bool) {
	if fold && r < 128 && isASCIILetter(byte(r)) {
		l, u := strings.ToLower(string(r)), strings.ToUpper(string(r))
		b.WriteString("[" + l + u + "]")
		return
	}
	if r < 128 && strings.ContainsRune(`\.+*?()|[]{}^$-`, r) {
		b.WriteByte('\\')
	}
	if r < 0x20 || r == 0x7F || r > 0x7E {
		fmt.Fprintf(b, `\x{%X}`, r)
		return
	}
	b.WriteRune(r)
}
