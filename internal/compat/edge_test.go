package compat_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// edgeDomains are created before the outbox table; edgeColumns use them.
const edgeDomains = `
CREATE DOMAIN public.d_text AS text;
CREATE DOMAIN public.d_tstz AS timestamptz;
CREATE DOMAIN public.d_num AS numeric(10,2);
CREATE DOMAIN public.d_d_num AS public.d_num;
CREATE DOMAIN public.d_d_tstz AS public.d_tstz;
`

// edgeColumns are typed columns with the values where a relay is most likely
// to write other bytes than Debezium: empty strings, domains (recursively),
// infinities, BC and five-digit years, NaN, numeric scales, floats whose
// shortest text is hard, non-ASCII array elements, explicit array bounds.
// Each value is its own event (the other typed columns NULL), so a
// difference names its column and value; one more event is all NULL.
var edgeColumns = []typedColumn{
	{"e_text", "text", []string{`''`, `'a'`, `'é🙂'`}},
	{"e_varchar", "varchar(20)", []string{`''`, `' '`}},
	{"e_dtext", "public.d_text", []string{`''`, `'x'`}},
	{"e_bytea", "bytea", []string{`''`, `'\x00ff'`}},
	{"e_dtstz", "public.d_tstz", []string{`'2026-01-02 03:04:05.5+00'`, `'infinity'`}},
	{"e_ddtstz", "public.d_d_tstz", []string{`'2026-01-02 03:04:05+00'`}},
	{"e_dnum", "public.d_num", []string{`12.5`, `-0.01`}},
	{"e_ddnum", "public.d_d_num", []string{`1.5`}},
	{"e_date", "date", []string{`'infinity'`, `'-infinity'`, `'0044-03-15 BC'`, `'0001-01-01 BC'`, `'12345-06-07'`, `'0001-01-01'`}},
	{"e_ts", "timestamp", []string{`'infinity'`, `'-infinity'`, `'0044-03-15 12:00:00 BC'`, `'12345-06-07 08:09:10.123456'`, `'0001-01-01 00:00:00'`}},
	{"e_ts3", "timestamp(3)", []string{`'infinity'`, `'-infinity'`, `'0044-03-15 12:00:00.5 BC'`, `'12345-06-07 08:09:10.123'`}},
	{"e_tstz", "timestamptz", []string{`'infinity'`, `'-infinity'`, `'0044-03-15 12:00:00+00 BC'`, `'12345-06-07 08:09:10.5+00'`}},
	{"e_num", "numeric", []string{`'NaN'`, `-1.10`, `100.000`, `0.000`, `1E+3`}},
	{"e_num2", "numeric(12,2)", []string{`'NaN'`, `-1.10`, `0`}},
	{"e_f4", "real", []string{`1.4E-45`, `1.17549435E-38`, `3.4028235E38`, `1.0E7`, `9999999`, `0.001`, `1.0E-4`, `'NaN'`, `'-Infinity'`, `-0.0`, `0.3`, `16777217`}},
	{"e_f8", "double precision", []string{`4.9E-324`, `2.2250738585072014E-308`, `1.0E23`, `2E23`, `9.999999999999999E22`, `1.0E7`, `0.001`, `1.0E-4`, `'NaN'`, `'Infinity'`, `-0.0`, `0.1`, `5E-324`, `1.7976931348623157E308`, `123456789012345680`}},
	{"e_text_arr", "text[]", []string{`'{é,🙂,"a b"}'`, `'{""}'`}},
	{"e_int_arr", "int[]", []string{`'[2:3]={1,2}'`, `'{{1,2},{3,4}}'`}},
	{"e_text_arr_b", "text[]", []string{`'[0:1]={a,b}'`}},
}

// TestDebeziumEdgeValues places every edge column both as a header and as
// an envelope field (alias env_<column>), under each converter (one Kafka
// Connect worker each), and compares each event's headers and value byte for
// byte. Its table of results is in docs/debezium.md.
func TestDebeziumEdgeValues(t *testing.T) {
	for _, conv := range []string{"string", "json"} {
		t.Run(conv, func(t *testing.T) { runEdge(t, conv) })
	}
}

func runEdge(t *testing.T, converter string) {
	s := startTyped(t, converter, "ed", edgeDomains, edgeColumns)
	ctx := context.Background()
	type ev struct{ id, col, typ, val string }
	var evs []ev
	insert := func(col, typ, val string) {
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", len(evs)+1)
		evs = append(evs, ev{id, col, typ, val})
		names, vals := "", ""
		if col != "" {
			names, vals = ", "+col, ", "+val
		}
		if _, err := s.db.Exec(ctx, fmt.Sprintf(`INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload%s) VALUES ('%s', '%s', 'A-1', 'T', '{"i": %d}'%s)`,
			names, id, s.aggType, len(evs), vals)); err != nil {
			t.Fatalf("insert %s = %s: %v", col, val, err)
		}
	}
	for _, c := range edgeColumns {
		for _, v := range c.values {
			insert(c.name, c.typ, v)
		}
	}
	var version int
	if err := s.db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version >= 140000 { // numeric infinities are new in Postgres 14 (not in a numeric with a precision)
		for _, v := range []string{`'Infinity'`, `'-Infinity'`} {
			insert("e_num", "numeric", v)
		}
	}
	insert("", "", "NULL") // every typed column NULL
	dbz, rly := s.collectAndStop(t, len(evs))

	oldJVM := javaFeature(t) < 19
	for _, e := range evs {
		d, r := dbz[e.id], rly[e.id]
		// The two differences migrate names (docs/debezium.md): a numeric
		// without a scale in a StringConverter envelope is a Struct whose
		// text holds a Java identity, and the doubles JDK 17 and 18 print
		// longer than JDK 19 on (the relay writes JDK 19's).
		d.value = envNumvStruct.ReplaceAll(d.value, []byte("<VariableScaleDecimal>"))
		r.value = envNumvText.ReplaceAll(r.value, []byte("<VariableScaleDecimal>"))
		if oldJVM {
			for jdk17, jdk19 := range jdk17Doubles {
				d.value = bytes.ReplaceAll(d.value, []byte(jdk17), []byte(jdk19))
				for i, h := range d.headers {
					if string(h.Value) == jdk17 {
						d.headers[i].Value = []byte(jdk19)
					}
				}
			}
		}
		what := e.col + " " + e.typ + " = " + e.val
		if e.col == "" {
			what = "all NULL"
		}
		same := true
		for _, c := range edgeColumns {
			dv, dok := headerValue(d.headers, c.name)
			rv, rok := headerValue(r.headers, c.name)
			if dok != rok || !bytes.Equal(dv, rv) || (dv == nil) != (rv == nil) {
				same = false
				t.Errorf("%s: %s header %s: Debezium %s, relay %s", converter, what, c.name, present(dok, dv), present(rok, rv))
			}
		}
		if !bytes.Equal(d.value, r.value) {
			same = false
			t.Errorf("%s: %s envelope:\n  Debezium %s\n  relay    %s", converter, what, d.value, r.value)
		}
		if same {
			t.Logf("%s: %s: same; header %s", converter, what, func() string {
				v, ok := headerValue(d.headers, e.col)
				return present(ok, v)
			}())
		}
	}
}

var (
	envNumvStruct = regexp.MustCompile(`env_e_num=Struct\{scale=\d+,value=\[B@[0-9a-f]+\}`)
	envNumvText   = regexp.MustCompile(`env_e_num=-?[0-9.]+`)
)

// jdk17Doubles are the edge values JDK 17 and 18 print otherwise than JDK 19
// on (Java's Double.toString and Float.toString changed to the shortest
// text in JDK 19): their text, and JDK 19's, which the relay writes.
var jdk17Doubles = map[string]string{
	"9.999999999999999E22":  "1.0E23",
	"1.9999999999999998E23": "2.0E23",
	"1.17549435E-38":        "1.1754944E-38",
}

// javaFeature is the feature release of the java command Kafka Connect runs
// on (17 for "openjdk 17.0.15").
func javaFeature(t *testing.T) int {
	out, err := exec.Command("java", "--version").Output()
	if err != nil {
		t.Fatalf("java --version: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 {
		t.Fatalf("java --version printed %q", out)
	}
	n, err := strconv.Atoi(strings.SplitN(f[1], ".", 2)[0])
	if err != nil {
		t.Fatalf("java --version printed %q", out)
	}
	return n
}

func present(ok bool, v []byte) string {
	if !ok {
		return "absent"
	}
	return bytesText(v)
}
