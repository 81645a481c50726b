package router

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv/jdk"
)

// javaRegexCases are constructs where Java's java.util.regex and Go's RE2
// differ, with inputs that tell them apart. refused, when set, is the
// construct the relay must name; otherwise its full matches must be Java's.
var javaRegexCases = []struct {
	regex   string
	inputs  []string
	refused string
}{
	{`[a-z&&[^aeiou]]+`, []string{"xyz", "abc", "a&&b"}, "&&"},
	{`[[:alpha:]]+`, []string{"abc", ":alp", "xyz"}, "[ inside a character class"},
	{`[a[bc]]x`, []string{"ax", "bx", "[x"}, "[ inside a character class"},
	{`\p{Alpha}+`, []string{"Order", "Ordér", "123"}, ""},
	{`\p{Lower}\p{Upper}\p{Digit}\p{Punct}`, []string{"aB1!", "aB1a", "éB1!"}, ""},
	{`[\p{Alnum}_]+`, []string{"a_1", "a-1"}, ""},
	{`\P{Alpha}+`, []string{"123", "a1"}, ""},
	{`(?i)order`, []string{"ORDER", "Order", "\u212Aorder", "order"}, ""},
	{`(?i)k`, []string{"K", "k", "\u212A"}, ""},
	{`(?i:ab)c`, []string{"ABc", "ABC"}, ""},
	{`(?i)[a-z]+`, []string{"ABC"}, "(?i)"},
	{`(?U)\w+`, []string{"abc", "é"}, "the flag U"},
	{`(?x) a b `, []string{"ab"}, "the flag x"},
	{`(?m)a$`, []string{"a"}, "the flag m"},
	{`(?u)(?i)é`, []string{"É"}, "the flag u"},
	{`a*+b`, []string{"aab"}, "possessive"},
	{`a++`, []string{"aa"}, "possessive"},
	{`(?=a)a`, []string{"a"}, "lookaround"},
	{`(?<!a)b`, []string{"b"}, "lookaround"},
	{`(?>a)`, []string{"a"}, "atomic"},
	{`(a)\1`, []string{"aa"}, "backreference"},
	{`\Qa.b\E`, []string{"a.b", "axb"}, ""},
	{`\Qa-b\E|[\Q-\E]`, []string{"a-b", "-"}, ""},
	{`a\sb`, []string{"a b", "a\x0Bb", "a\u00A0b"}, ""},
	{`a\Sb`, []string{"a\x0Bb", "axb"}, ""},
	{`a\vb`, []string{"a\x0Bb", "a\nb", "a\u2028b"}, ""},
	{`a\hb`, []string{"a b", "a\u00A0b", "a\tb", "a\nb"}, ""},
	{`a.b`, []string{"axb", "a\rb", "a\u0085b", "a\u2028b", "a\nb"}, ""},
	{`(?s)a.b`, []string{"a\rb", "a\nb"}, ""},
	{`\u0041\e\0101`, []string{"A\x1BA"}, ""},
	{`\bab`, []string{"ab"}, `\b`},
	{`(?<type>[a-z]+)\.(\d+)`, []string{"order.12", "order.x"}, ""},
	{`\w+\d*\W?`, []string{"ab1!", "é"}, ""},
	{`\p{L}+`, []string{"Ordér", "1"}, ""},
	{`\p{IsAlphabetic}`, []string{"a"}, `\p{IsAlphabetic}`},
	{`a\Rb`, []string{"a\r\nb"}, `\R`},
}

// TestJavaRegex runs each construct through Java's own java.util.regex
// (Pattern.matches, as Kafka Connect's RegexRouter, which Debezium's
// router uses, matches the whole aggregate type) with the installed JDK and
// compares: a translated pattern must match exactly the inputs Java matches;
// a refused one must name the construct. It skips only without a java
// command (CI installs one for Debezium).
func TestJavaRegex(t *testing.T) {
	java, err := exec.LookPath("java")
	if err != nil {
		t.Skip("no java command: install a JDK to compare with java.util.regex")
	}
	var src strings.Builder
	src.WriteString("import java.util.regex.*;\npublic class R { public static void main(String[] a) {\n")
	for _, c := range javaRegexCases {
		src.WriteString("try { Pattern p = Pattern.compile(" + javaString(c.regex) + ");\n")
		for _, in := range c.inputs {
			src.WriteString("System.out.println(p.matcher(" + javaString(in) + ").matches());\n")
		}
		src.WriteString(fmt.Sprintf("} catch (PatternSyntaxException e) { for (int i = 0; i < %d; i++) System.out.println(\"error\"); }\n", len(c.inputs)))
	}
	src.WriteString("}}\n")
	lines := jdk.Run(t, java, "R", src.String())
	n := 0
	for _, c := range javaRegexCases {
		java := lines[n : n+len(c.inputs)]
		n += len(c.inputs)
		tr, err := compileTopicRegex(c.regex, "x")
		if c.refused != "" {
			if err == nil || !strings.Contains(err.Error(), c.refused) {
				t.Errorf("%s: relay error %v; want one naming %q (Java: %v)", c.regex, err, c.refused, java)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: refused (%v); Java matches %v", c.regex, err, java)
			continue
		}
		for i, in := range c.inputs {
			got := strconv.FormatBool(tr.re.MatchString(in))
			if got != java[i] {
				t.Errorf("%s on %q: Java %s, relay %s (Go regex %s)", c.regex, in, java[i], got, tr.re)
			}
		}
	}
}

// javaString is s as a Java expression: a string literal, with characters
// other than printable ASCII appended as (char) values (javac reads \u
// escapes before it lexes, so they cannot be written as such).
func javaString(s string) string {
	var b strings.Builder
	b.WriteString(`("`)
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || r > 0x7E:
			if r > 0xFFFF {
				panic("javaString: outside the BMP")
			}
			fmt.Fprintf(&b, `" + (char) 0x%X + "`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteString(`")`)
	return b.String()
}
