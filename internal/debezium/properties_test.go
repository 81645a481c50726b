package debezium

import (
	"maps"
	"strings"
	"testing"
)

// The expected maps were checked against java.util.Properties.load (JDK 17).
func TestParseProperties(t *testing.T) {
	tests := []struct {
		name, in string
		want     map[string]string
	}{
		{"separators", "a=b\nk2:v2\nk3 v3\nk4   =   v4\nk5\nk6=\n", map[string]string{
			"a": "b", "k2": "v2", "k3": "v3", "k4": "v4", "k5": "", "k6": ""}},
		{"comments and blanks", "  # comment\n! also\n\n   \nx=1\n", map[string]string{"x": "1"}},
		{"a blank ends the key", "key with space = v\n", map[string]string{"key": "with space = v"}},
		{"escaped blanks in the key", `key\ with\ space = v` + "\n", map[string]string{"key with space": "v"}},
		{"trailing blanks kept", "k=v  \n", map[string]string{"k": "v  "}},
		{"one separator only", "a==b\nc = = d\ne:=f\n", map[string]string{"a": "=b", "c": "= d", "e": "=f"}},
		{"continuation", "long = one \\\n     two \\\\\n", map[string]string{"long": `one two \`}},
		{"comment marker in a continuation", "next = x\\\n  # not a comment\\\n\\\n  end\n", map[string]string{"next": "x# not a commentend"}},
		{"continuation onto a blank line", "cont=a\\\n\nafter=1\n", map[string]string{"cont": "a", "after": "1"}},
		{"backslash at end of input", `trail=x\`, map[string]string{"trail": "x"}},
		{"escapes", `esc=\t\n\r\f\u0041\\\=\:\#\!\z`, map[string]string{"esc": "\t\n\r\fA\\=:#!z"}},
		{"surrogate pair", `sur=\ud83d\ude00`, map[string]string{"sur": "😀"}},
		{"unicode escapes", `u=\u00e9\u4e2d`, map[string]string{"u": "é中"}},
		{"escaped leading blank", `\ lead=1`, map[string]string{" lead": "1"}},
		{"last duplicate wins", "win=1\nwin=2\n", map[string]string{"win": "2"}},
		{"line terminators", "cr=1\r\ncr2=2\rcr3=3", map[string]string{"cr": "1", "cr2": "2", "cr3": "3"}},
		{"url value", "url=jdbc:postgresql://h:5432/db\n", map[string]string{"url": "jdbc:postgresql://h:5432/db"}},
		{"utf-8", "x=é\n", map[string]string{"x": "é"}},
		{"latin-1", "x=\xe9\n", map[string]string{"x": "é"}},
		{"connector", `name=outbox
connector.class=io.debezium.connector.postgresql.PostgresConnector
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.topic.replacement=events.${routedByValue}
table.include.list=public\\.outbox
`, map[string]string{
			"name":                   "outbox",
			"connector.class":        "io.debezium.connector.postgresql.PostgresConnector",
			"transforms":             "outbox",
			"transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
			"transforms.outbox.route.topic.replacement": "events.${routedByValue}",
			"table.include.list":                        `public\.outbox`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseProperties(strings.NewReader(tt.in))
			if err != nil {
				t.Fatalf("ParseProperties(%q): %v", tt.in, err)
			}
			if !maps.Equal(got, tt.want) {
				t.Errorf("ParseProperties(%q) = %q; want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParsePropertiesMalformedUnicode(t *testing.T) {
	for _, in := range []string{"a=\\u12\n", "a=\\u12zz\n", "\\uXYZW=1\n"} {
		_, err := ParseProperties(strings.NewReader("ok=1\n" + in))
		if err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "four hex digits") {
			t.Errorf("ParseProperties(%q) = %v; want an error on line 2 asking for four hex digits", in, err)
		}
	}
}

func TestFormatProperties(t *testing.T) {
	tests := []struct {
		props map[string]string
		want  string
	}{
		{map[string]string{"a=b:c": "x"}, "a\\=b\\:c=x\n"},
		{map[string]string{"p": `w:d\x`}, "p=w:d\\\\x\n"},
		{map[string]string{"k": " lead"}, "k=\\ lead\n"},
		{map[string]string{"k": "#x"}, "k=\\#x\n"},
		{map[string]string{"k": "zoë"}, "k=zo\\u00eb\n"},
		{map[string]string{"k": "😀"}, "k=\\ud83d\\ude00\n"},
		{map[string]string{"b": "2", "a": "1"}, "a=1\nb=2\n"},
	}
	for _, tt := range tests {
		if got := FormatProperties(tt.props); got != tt.want {
			t.Errorf("FormatProperties(%q) = %q; want %q", tt.props, got, tt.want)
		}
	}
}

// What FormatProperties writes, ParseProperties (Java's rules) reads back.
func TestFormatPropertiesRoundTrip(t *testing.T) {
	props := map[string]string{
		"database.password": `p@ss w=rd:#!\ 😀 zoë` + "\t\n\r",
		" key with = and :": "#value",
		"plain":             "value",
		"empty":             "",
		"trailing":          "space ",
	}
	got, err := ParseProperties(strings.NewReader(FormatProperties(props)))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, props) {
		t.Errorf("round trip = %q; want %q", got, props)
	}
}
