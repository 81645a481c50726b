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
	t := &javaTranslator{re: re, stack: []javaFlags{{}}}
	for ; t.i < len(re); t.i++ {
		c := re[t.i]
		var err error
		switch {
		case c == '\\':
			err = t.escape()
		case t.inClass:
			err = t.classByte(c)
		case c == '[':
			t.openClass()
		case c == '.':
			if t.cur().s {
				t.b.WriteString(`(?s:.)`)
			} else {
				t.b.WriteString(`[^\n\r\x{85}\x{2028}\x{2029}]`)
			}
		case c == '(':
			err = t.group()
		case c == ')':
			if len(t.stack) > 1 {
				t.stack = t.stack[:len(t.stack)-1]
			}
			t.b.WriteByte(c)
		case c == '*' || c == '+' || c == '?' || c == '}':
			t.b.WriteByte(c)
			if t.i+1 < len(re) && re[t.i+1] == '+' {
				err = refuseJava("the possessive quantifier "+string(c)+"+", "Go has no possessive quantifiers")
			}
		default:
			if t.cur().i && isASCIILetter(c) {
				writeLiteral(&t.b, rune(c), true)
			} else {
				t.b.WriteByte(c)
			}
		}
		if err != nil {
			return "", err
		}
	}
	return t.b.String(), nil
}

// javaFlags are the Java flags that change how translateJavaRegex writes
// what follows: (?i) and (?s).
type javaFlags struct{ i, s bool }

// javaTranslator is the state of one translateJavaRegex: where it reads,
// what it has written, the flags of each open group (the last is in force)
// and whether it is inside a character class.
type javaTranslator struct {
	re         string
	i          int // the byte being read; each step leaves it on the last byte it used
	b          strings.Builder
	stack      []javaFlags
	inClass    bool
	classStart int // the index of the first member of the open class
}

func (t *javaTranslator) cur() *javaFlags { return &t.stack[len(t.stack)-1] }

// refuseJava is translateJavaRegex's error for a construct it will not translate.
func refuseJava(construct, why string) error {
	return fmt.Errorf("%s is Java syntax that Go reads otherwise or not at all (%s): rewrite the expression without it, or route these aggregate types with topics.overrides", construct, why)
}

// escape translates the escape whose backslash is at t.i.
func (t *javaTranslator) escape() error {
	re := t.re
	if t.i+1 >= len(re) {
		return refuseJava(`a trailing \`, "an incomplete escape")
	}
	e := re[t.i+1]
	t.i++
	switch e {
	case 'Q':
		t.quoted()
	case 's', 'S', 'v', 'V', 'h', 'H':
		return t.spaceClass(e)
	case 'p', 'P':
		return t.property(e)
	case 'u', 'e', '0':
		return t.codePoint(e)
	case 'b', 'B':
		if t.inClass && e == 'b' {
			return refuseJava(`\b inside a character class`, "Java refuses it")
		}
		return refuseJava(`\`+string(e), "Java's word boundary counts non-ASCII letters and digits as word characters, Go's only ASCII ones")
	case 'R', 'X', 'G', 'Z', 'c', 'k':
		return refuseJava(`\`+string(e), "Go has no such escape, or reads it otherwise")
	case '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return refuseJava(`\`+string(e), "a backreference")
	default:
		if e >= 'a' && e <= 'z' || e >= 'A' && e <= 'Z' {
			// \d \D \w \W \t \n \r \f \a \x \A \z: the same in both.
			if !strings.ContainsRune("dDwWtnrfaxAz", rune(e)) {
				return refuseJava(`\`+string(e), "not an escape both read alike")
			}
		}
		t.b.WriteByte('\\')
		t.b.WriteByte(e)
	}
	return nil
}

// quoted writes \Q...\E (or \Q to the end) as literals; t.i is on the Q.
func (t *javaTranslator) quoted() {
	re, i := t.re, t.i
	end := strings.Index(re[i+1:], `\E`)
	lit := re[i+1:]
	if end >= 0 {
		lit = re[i+1 : i+1+end]
		t.i += end + 2
	} else {
		t.i = len(re)
	}
	for _, r := range lit {
		writeLiteral(&t.b, r, t.cur().i && !t.inClass)
	}
}

// spaceClass writes \s \S \v \V \h \H as the ASCII classes Java means.
func (t *javaTranslator) spaceClass(e byte) error {
	switch e {
	case 's':
		t.b.WriteString(classOf(`\t\n\x0B\f\r `, t.inClass, false))
	case 'S':
		if t.inClass {
			return refuseJava(`\S inside a character class`, "Java's excludes \\x0B, Go's does not")
		}
		t.b.WriteString(classOf(`\t\n\x0B\f\r `, false, true))
	case 'v', 'V':
		if t.inClass && e == 'V' {
			return refuseJava(`\V inside a character class`, "a negated Java class")
		}
		t.b.WriteString(classOf(`\n\x0B\f\r\x{85}\x{2028}\x{2029}`, t.inClass, e == 'V'))
	case 'h', 'H':
		if t.inClass && e == 'H' {
			return refuseJava(`\H inside a character class`, "a negated Java class")
		}
		t.b.WriteString(classOf(`\t \x{A0}\x{1680}\x{180E}\x{2000}-\x{200A}\x{202F}\x{205F}\x{3000}`, t.inClass, e == 'H'))
	}
	return nil
}

// property writes \p{Name} or \pN (and \P): a Java POSIX class as its ASCII
// members, a Unicode general category as is.
func (t *javaTranslator) property(e byte) error {
	re, i := t.re, t.i
	name := ""
	switch {
	case i+1 < len(re) && re[i+1] == '{':
		end := strings.IndexByte(re[i+1:], '}')
		if end < 0 {
			return refuseJava(`\`+string(e)+"{", "an unclosed property")
		}
		name = re[i+2 : i+1+end]
		t.i += end + 1
	case i+1 < len(re):
		name = re[i+1 : i+2]
		t.i++
	}
	if set, ok := javaPOSIX[name]; ok {
		if t.inClass && e == 'P' {
			return refuseJava(`\P{`+name+`} inside a character class`, "a negated Java class")
		}
		t.b.WriteString(classOf(set, t.inClass, e == 'P'))
	} else if generalCategory[name] {
		t.b.WriteString(`\` + string(e) + "{" + name + "}")
	} else {
		return refuseJava(`\`+string(e)+"{"+name+"}", "not a Unicode general category Go knows by that name")
	}
	return nil
}

// codePoint writes \uXXXX, \e and octal \0nn as Go's \x{...}.
func (t *javaTranslator) codePoint(e byte) error {
	re, i := t.re, t.i
	switch e {
	case 'u':
		if i+4 >= len(re) {
			return refuseJava(`\u`, "an incomplete escape")
		}
		v, err := strconv.ParseUint(re[i+1:i+5], 16, 32)
		if err != nil {
			return refuseJava(`\u`+re[i+1:i+5], "not four hex digits")
		}
		t.i += 4
		writeLiteral(&t.b, rune(v), t.cur().i && !t.inClass)
	case 'e':
		t.b.WriteString(`\x{1B}`)
	case '0':
		j := i + 1
		for j < len(re) && j < i+4 && re[j] >= '0' && re[j] <= '7' {
			j++
		}
		v, err := strconv.ParseUint(re[i+1:j], 8, 32)
		if err != nil || v > 0377 {
			return refuseJava(`\0`+re[i+1:j], "an octal escape needs one to three octal digits up to 0377")
		}
		t.b.WriteString(fmt.Sprintf(`\x{%X}`, v))
		t.i = j - 1
	}
	return nil
}

// classByte translates c, a byte inside a character class other than a backslash.
func (t *javaTranslator) classByte(c byte) error {
	re, i := t.re, t.i
	switch {
	case c == '[':
		return refuseJava("[ inside a character class", "Java reads a nested class or union ([a[bc]], [[:alpha:]] is the characters :alph), Go a literal or a POSIX class")
	case c == '&' && i+1 < len(re) && re[i+1] == '&':
		return refuseJava("&& inside a character class", "Java's class intersection; Go reads two '&' characters")
	case c == ']' && i > t.classStart:
		t.inClass = false
		t.b.WriteByte(c)
	case c == ']':
		return refuseJava("] first in a character class", "Java and Go read it otherwise")
	default:
		if t.cur().i && isASCIILetter(c) {
			return refuseJava("a letter in a character class under (?i)", "Java's case-insensitive match is ASCII-only, Go's Unicode; write both cases ([aAbB])")
		}
		t.b.WriteByte(c)
	}
	return nil
}

// openClass opens the character class whose '[' is at t.i (with its '^').
func (t *javaTranslator) openClass() {
	t.inClass = true
	t.b.WriteByte('[')
	t.classStart = t.i + 1
	if t.i+1 < len(t.re) && t.re[t.i+1] == '^' {
		t.b.WriteByte('^')
		t.i++
		t.classStart = t.i + 1
	}
}

// group translates the '(' at t.i: a group, (?flags) or (?flags:...),
// refusing lookaround and atomic groups.
func (t *javaTranslator) group() error {
	rest := t.re[t.i+1:]
	switch {
	case strings.HasPrefix(rest, "?="), strings.HasPrefix(rest, "?!"), strings.HasPrefix(rest, "?<="), strings.HasPrefix(rest, "?<!"):
		return refuseJava("("+rest[:min(len(rest), 3)], "lookaround")
	case strings.HasPrefix(rest, "?>"):
		return refuseJava("(?>", "an atomic group")
	case strings.HasPrefix(rest, "?<"), strings.HasPrefix(rest, "?:"), !strings.HasPrefix(rest, "?"):
		t.stack = append(t.stack, *t.cur())
		t.b.WriteByte('(')
		return nil
	}
	return t.flagGroup(rest)
}

// flagGroup translates (?flags) (to the end of the enclosing group) or
// (?flags: (a group of their own); rest follows the '('.
func (t *javaTranslator) flagGroup(rest string) error {
	j := 1
	for j < len(rest) && rest[j] != ')' && rest[j] != ':' {
		j++
	}
	if j >= len(rest) {
		return refuseJava("(?"+rest[1:], "an unclosed group")
	}
	f := *t.cur()
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
			return refuseJava("the flag "+string(fc)+" in (?"+rest[1:j]+")", "Java's d (UNIX_LINES), m (its line terminators), u (Unicode case), x (comments), U (Unicode classes: Go's U is ungreedy) and c differ in Go")
		}
	}
	if rest[j] == ')' {
		*t.cur() = f // to the end of the enclosing group
	} else {
		t.stack = append(t.stack, f)
		t.b.WriteString("(?:")
	}
	t.i += j + 1
	return nil
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
