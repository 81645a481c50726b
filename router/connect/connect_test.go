package connect

import (
	"math"
	"math/big"
	"testing"
)

// textOID is text's type OID: a type written as its text.
const textOID = 25

// The figures below are what Debezium 3.1.3 wrote for the same values
// (internal/compat's TestDebeziumColumnTypes compares them end to end).
func TestRender(t *testing.T) {
	tests := []struct {
		ct                  Type
		in                  string
		header, strct, json string
	}{
		{Type{timestamptzOID, -1}, "2026-01-02 01:04:05+00", "2026-01-02T01:04:05.000000Z", "2026-01-02T01:04:05.000000Z", `"2026-01-02T01:04:05.000000Z"`},
		{Type{timestamptzOID, 3}, "2026-06-01 07:00:00.1+00", "2026-06-01T07:00:00.100Z", "2026-06-01T07:00:00.100Z", `"2026-06-01T07:00:00.100Z"`},
		{Type{timestamptzOID, 0}, "2026-06-01 07:00:00+05:30", "2026-06-01T01:30:00Z", "2026-06-01T01:30:00Z", `"2026-06-01T01:30:00Z"`},
		{Type{timestampOID, 3}, "1969-12-31 23:59:59.5", "-500", "-500", "-500"},
		{Type{timestampOID, -1}, "1969-12-31 23:59:59.5", "-500000", "-500000", "-500000"},
		{Type{dateOID, -1}, "1969-12-31", "-1", "-1", "-1"},
		{Type{timeOID, -1}, "24:00:00", "86400000000", "86400000000", "86400000000"},
		{Type{timeOID, 3}, "22:25:41.476", "80741476", "80741476", "80741476"},
		{Type{timetzOID, -1}, "12:00:00-07", "19:00:00Z", "19:00:00Z", `"19:00:00Z"`},
		{Type{timetzOID, -1}, "00:30:00.5+01", "23:30:00.5Z", "23:30:00.5Z", `"23:30:00.5Z"`},
		{Type{numericOID, 12<<16 | 2 + 4}, "-0.01", "-0.01", "-0.01", `"/w=="`},
		{Type{numericOID, 20<<16 | 10 + 4}, "0.0000000123", "1.23E-8", "1.23E-8", `"ew=="`},
		{Type{numericOID, 20<<16 | 10 + 4}, "0.0000000000", "0E-10", "0E-10", `"AA=="`},
		{Type{numericOID, -1}, "12.5", `{"scale":1,"value":"fQ=="}`, "12.5", `{"scale":1,"value":"fQ=="}`},
		{Type{numericOID, -1}, "NaN", "", "", `null`},
		{Type{numericOID, 12<<16 | 2 + 4}, "NaN", "", "", `null`},
		{Type{numericOID, -1}, "-Infinity", "", "", `null`},
		{Type{numericOID, -1}, "-1.10", `{"scale":1,"value":"9Q=="}`, "-1.1", `{"scale":1,"value":"9Q=="}`},
		{Type{numericOID, -1}, "100.000", `{"scale":0,"value":"ZA=="}`, "100", `{"scale":0,"value":"ZA=="}`},
		{Type{textOID, -1}, "", "", "", `""`},
		{Type{dateOID, -1}, "0044-03-15 BC", "-735160", "-735160", "-735160"},
		{Type{dateOID, -1}, "12345-06-07", "3789548", "3789548", "3789548"},
		{Type{dateOID, -1}, "-infinity", "-2147472691", "-2147472691", "-2147472691"},
		{Type{timestampOID, -1}, "infinity", "9223372036825200000", "9223372036825200000", "9223372036825200000"},
		{Type{timestampOID, 3}, "infinity", "9223372036825200", "9223372036825200", "9223372036825200"},
		{Type{timestampOID, -1}, "0044-03-15 12:00:00 BC", "-63517780800000000", "-63517780800000000", "-63517780800000000"},
		{Type{timestampOID, 3}, "12345-06-07 08:09:10.123", "327416976550123", "327416976550123", "327416976550123"},
		{Type{timestamptzOID, -1}, "0044-03-15 12:00:00+00 BC", "-0043-03-15T12:00:00.000000Z", "-0043-03-15T12:00:00.000000Z", `"-0043-03-15T12:00:00.000000Z"`},
		{Type{timestamptzOID, -1}, "12345-06-07 08:09:10.5+00", "+12345-06-07T08:09:10.500000Z", "+12345-06-07T08:09:10.500000Z", `"+12345-06-07T08:09:10.500000Z"`},
		{Type{float4OID, -1}, "1e-45", "1.4E-45", "1.4E-45", "1.4E-45"},
		{Type{float8OID, -1}, "5e-324", "4.9E-324", "4.9E-324", "4.9E-324"},
		{Type{textArrayOID, -1}, `{é,🙂}`, `["é","🙂"]`, `[é, 🙂]`, `["é","\uD83D\uDE42"]`},
		{Type{int4ArrayOID, -1}, "[2:3]={1,2}", "[1,2]", "[1, 2]", "[1,2]"},
		{Type{float8OID, -1}, "-1e-07", "-1.0E-7", "-1.0E-7", "-1.0E-7"},
		{Type{float8OID, -1}, "1e+21", "1.0E21", "1.0E21", "1.0E21"},
		{Type{float8OID, -1}, "100", "100.0", "100.0", "100.0"},
		{Type{float8OID, -1}, "Infinity", "Infinity", "Infinity", `"Infinity"`},
		{Type{float4OID, -1}, "1e+10", "1.0E10", "1.0E10", "1.0E10"},
		{Type{byteaOID, -1}, `\x0001ff`, "AAH/", "java.nio.HeapByteBuffer[pos=0 lim=3 cap=3]", `"AAH/"`},
		{Type{int4ArrayOID, -1}, "{-1,NULL,7}", "[-1,null,7]", "[-1, null, 7]", "[-1,null,7]"},
		{Type{textArrayOID, -1}, `{a,"b c","x\"y","back\\slash"}`, `["a","b c","x\"y","back\\slash"]`, `[a, b c, x"y, back\slash]`, `["a","b c","x\"y","back\\slash"]`},
		{Type{boolArrayOID, -1}, "{t,NULL}", "[true,null]", "[true, null]", "[true,null]"},
		{Type{float8ArrayOID, -1}, "{1.5,1e+21}", "[1.5,1.0E21]", "[1.5, 1.0E21]", "[1.5,1.0E21]"},
		// What cannot be read is written as it is.
		{Type{int4ArrayOID, -1}, "{{1,2},{3,4}}", "[null,null]", "[null, null]", "[null,null]"},
		{Type{textArrayOID, -1}, `[1:2][1:1]={{"}"},{b}}`, "[null,null]", "[null, null]", "[null,null]"},
		{Type{timestamptzOID, -1}, "infinity", "infinity", "infinity", `"infinity"`},
	}
	for _, tt := range tests {
		v := []byte(tt.in)
		if got := string(HeaderValue(tt.ct, v)); got != tt.header {
			t.Errorf("HeaderValue(%v, %q) = %q; want %q", tt.ct, tt.in, got, tt.header)
		}
		if got := string(structText(tt.ct, v)); got != tt.strct {
			t.Errorf("structText(%v, %q) = %q; want %q", tt.ct, tt.in, got, tt.strct)
		}
		if got := string(AppendJSON(nil, tt.ct, v)); got != tt.json {
			t.Errorf("AppendJSON(%v, %q) = %q; want %q", tt.ct, tt.in, got, tt.json)
		}
	}
	// Debezium writes an empty bytea as an empty header value, not a null
	// one (internal/compat's TestDebeziumEdgeValues, reading both with kgo).
	if got := HeaderValue(Type{byteaOID, -1}, []byte(`\x`)); got == nil || len(got) != 0 {
		t.Errorf("HeaderValue of an empty bytea = %q (nil %t); want an empty, non-nil value", got, got == nil)
	}
	if got := HeaderValue(Type{byteaOID, -1}, nil); got != nil {
		t.Errorf("HeaderValue of a NULL bytea = %q; want nil (a null header)", got)
	}
}

func TestTwosComplement(t *testing.T) {
	for _, tt := range []struct {
		x    int64
		want []byte
	}{{0, []byte{0}}, {-1, []byte{0xff}}, {125, []byte{0x7d}}, {128, []byte{0, 0x80}}, {-128, []byte{0x80}}, {-129, []byte{0xff, 0x7f}}, {1250, []byte{0x04, 0xe2}}} {
		if got := twosComplement(big.NewInt(tt.x)); string(got) != string(tt.want) {
			t.Errorf("twosComplement(%d) = %x; want %x", tt.x, got, tt.want)
		}
	}
	if got := javaFloat(math.Copysign(0, -1), 64); got != "-0.0" {
		t.Errorf("javaFloat(-0) = %q", got)
	}
}

// FuzzRender: no text of any type makes a writer panic.
func FuzzRender(f *testing.F) {
	for _, s := range []string{"{1,2}", `{"a\"`, "12:00:00+", "1e400", "2026-01-01 00:00:00+99", `\xzz`, "{,}", "-.5"} {
		f.Add(s)
	}
	oids := []uint32{boolOID, float4OID, float8OID, dateOID, timeOID, timestampOID, timestamptzOID, timetzOID, numericOID, byteaOID, int4ArrayOID, textArrayOID, float8ArrayOID}
	f.Fuzz(func(t *testing.T, s string) {
		for _, oid := range oids {
			for _, mod := range []int32{-1, 3, 20<<16 | 10 + 4} {
				ct := Type{oid, mod}
				HeaderValue(ct, []byte(s))
				structText(ct, []byte(s))
				AppendJSON(nil, ct, []byte(s))
			}
		}
	})
}

// The envelope as Debezium 3.1.3 wrote it (internal/compat's
// TestSameAsDebeziumStringEnvelope and TestSameAsDebeziumOptions compare
// them end to end): under StringConverter a null field is left out, under
// JsonConverter it is null.
func TestEnvelope(t *testing.T) {
	tests := []struct {
		json          bool
		payload, want string
	}{
		{false, `{"a": 1}`, `Struct{payload={"a": 1},tenant=7,at=2026-01-02T01:04:05.000000Z}`},
		{false, "<nil>", `Struct{tenant=7,at=2026-01-02T01:04:05.000000Z}`},
		{true, `{"a": 1}`, `{"payload":"{\"a\": 1}","tenant":"7","none":null,"at":"2026-01-02T01:04:05.000000Z"}`},
		{true, "<nil>", `{"payload":null,"tenant":"7","none":null,"at":"2026-01-02T01:04:05.000000Z"}`},
	}
	for _, tt := range tests {
		var payload []byte
		if tt.payload != "<nil>" {
			payload = []byte(tt.payload)
		}
		e := NewEnvelope(tt.json, Type{textOID, -1}, payload)
		e.Add("tenant", Type{textOID, -1}, []byte("7"))
		e.Add("none", Type{numericOID, -1}, nil)
		e.Add("at", Type{timestamptzOID, -1}, []byte("2026-01-02 01:04:05+00"))
		if got := string(e.Bytes()); got != tt.want {
			t.Errorf("envelope (json %t) of payload %q = %s; want %s", tt.json, tt.payload, got, tt.want)
		}
	}
}
