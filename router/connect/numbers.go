package connect

import (
	"encoding/base64"
	"math"
	"math/big"
	"strconv"
	"strings"
)

func boolText(v []byte) []byte {
	switch string(v) {
	case "t":
		return []byte("true")
	case "f":
		return []byte("false")
	}
	return v
}

// renderFloat writes a real or double precision as Java prints it.
func renderFloat(dst []byte, ct Type, v []byte, w int) []byte {
	bits := 64
	if ct.OID == float4OID {
		bits = 32
	}
	f, err := strconv.ParseFloat(string(v), bits)
	if err != nil {
		return asText(dst, v, w)
	}
	s := javaFloat(f, bits)
	if w == inJSON && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return AppendJSONString(dst, []byte(s)) // Jackson quotes non-numeric numbers
	}
	return append(dst, s...)
}

// renderNumeric writes a numeric. With a declared scale it is a Connect
// Decimal: BigDecimal.toString in text, the unscaled value's two's
// complement bytes in base64 under JsonConverter. Without one it is
// Debezium's VariableScaleDecimal Struct {scale, value}: a JSON object in a
// header and under JsonConverter; Struct.toString prints the bytes' Java
// identity ([B@1b2c3d), which cannot be reproduced, so the text is written
// (migrate reports it), so the number is written, at Debezium's scale. NaN
// and the infinities (Postgres 14 on) are null, as Debezium's.
func renderNumeric(dst []byte, ct Type, v []byte, w int) []byte {
	switch string(v) {
	case "NaN", "Infinity", "-Infinity":
		// Debezium writes them as null (decimal.handling.mode precise,
		// logging an error); the infinities are Postgres 14's.
		return asNull(dst, w)
	}
	unscaled, scale, ok := parseDecimal(string(v))
	if !ok {
		return asText(dst, v, w)
	}
	if ct.Mod < 0 {
		// VariableScaleDecimal drops the fraction's trailing zeros (-1.10
		// is scale 1, 100.000 scale 0) but never goes below scale 0.
		for scale > 0 && new(big.Int).Rem(unscaled, big.NewInt(10)).Sign() == 0 {
			unscaled.Quo(unscaled, big.NewInt(10))
			scale--
		}
		if w == inStruct {
			return append(dst, bigDecimalString(unscaled, scale)...)
		}
		dst = append(strconv.AppendInt(append(dst, `{"scale":`...), int64(scale), 10), `,"value":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, twosComplement(unscaled))
		return append(dst, `"}`...)
	}
	if w == inJSON {
		dst = append(dst, '"')
		return append(base64.StdEncoding.AppendEncode(dst, twosComplement(unscaled)), '"')
	}
	return append(dst, bigDecimalString(unscaled, scale)...)
}

// javaFloat formats f as Java's Double.toString (bits 64) or Float.toString
// (32) does from JDK 19 on (Raffaello Giulietti's specification), which
// Connect's converters and Jackson use: the shortest decimal that reads back
// as f, but when that has one digit, the closest one of at most two (Java
// writes Float.MIN_VALUE 1.4E-45 where Go writes 1e-45); plain between 10^-3
// and 10^7 with at least one fraction digit, else d.dddE±n. JDK 17 and 18
// print a few values with more digits than needed (1.0E23 as
// 9.999999999999999E22): docs/debezium.md names them.
func javaFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0 && math.Signbit(f):
		return "-0.0"
	case f == 0:
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, bits)
	if mant, _, _ := strings.Cut(e, "e"); !strings.Contains(mant, ".") {
		// One digit: the closest two-digit decimal, if it reads back as f.
		if two := strconv.FormatFloat(f, 'e', 1, bits); parsesAs(two, f, bits) {
			e = two
		}
	}
	mant, exp, _ := strings.Cut(e, "e")
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.TrimRight(strings.Replace(mant, ".", "", 1), "0")
	if digits == "" {
		digits = "0"
	}
	x, _ := strconv.Atoi(exp) // f = 0.d1d2... × 10^(x+1)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	if a := math.Abs(f); a >= 1e-3 && a < 1e7 {
		switch {
		case x < 0:
			b.WriteString("0.")
			b.WriteString(strings.Repeat("0", -x-1))
			b.WriteString(digits)
		case len(digits) > x+1:
			b.WriteString(digits[:x+1])
			b.WriteByte('.')
			b.WriteString(digits[x+1:])
		default:
			b.WriteString(digits)
			b.WriteString(strings.Repeat("0", x+1-len(digits)))
			b.WriteString(".0")
		}
		return b.String()
	}
	b.WriteString(digits[:1])
	b.WriteByte('.')
	if len(digits) > 1 {
		b.WriteString(digits[1:])
	} else {
		b.WriteByte('0')
	}
	b.WriteByte('E')
	b.WriteString(strconv.Itoa(x))
	return b.String()
}

// parsesAs reports whether s reads back as f at bits' precision.
func parsesAs(s string, f float64, bits int) bool {
	g, err := strconv.ParseFloat(s, bits)
	return err == nil && g == f
}

// parseDecimal reads Postgres's text of a finite numeric into its unscaled
// value and scale (the digits after the point).
func parseDecimal(s string) (*big.Int, int, bool) {
	intPart, frac, _ := strings.Cut(s, ".")
	u, ok := new(big.Int).SetString(intPart+frac, 10)
	if !ok || strings.ContainsAny(frac, "+-") {
		return nil, 0, false
	}
	return u, len(frac), true
}

// bigDecimalString is Java's BigDecimal.toString of unscaled × 10^-scale:
// plain unless the adjusted exponent is below -6, then scientific (1.23E-8,
// 0E-10).
func bigDecimalString(unscaled *big.Int, scale int) string {
	coeff := new(big.Int).Abs(unscaled).String()
	sign := ""
	if unscaled.Sign() < 0 {
		sign = "-"
	}
	adjusted := len(coeff) - 1 - scale
	if scale >= 0 && adjusted >= -6 {
		switch {
		case scale == 0:
			return sign + coeff
		case len(coeff) > scale:
			return sign + coeff[:len(coeff)-scale] + "." + coeff[len(coeff)-scale:]
		default:
			return sign + "0." + strings.Repeat("0", scale-len(coeff)) + coeff
		}
	}
	s := sign + coeff[:1]
	if len(coeff) > 1 {
		s += "." + coeff[1:]
	}
	s += "E"
	if adjusted > 0 {
		s += "+"
	}
	return s + strconv.Itoa(adjusted)
}

// twosComplement is Java's BigInteger.toByteArray: the shortest big-endian
// two's complement bytes of x.
func twosComplement(x *big.Int) []byte {
	mag := x
	if x.Sign() < 0 {
		mag = new(big.Int).Sub(new(big.Int).Neg(x), big.NewInt(1))
	}
	n := mag.BitLen()/8 + 1
	if x.Sign() >= 0 {
		return x.FillBytes(make([]byte, n))
	}
	v := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*n)), x)
	return v.FillBytes(make([]byte, n))
}
