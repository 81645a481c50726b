package connect

import (
	"math"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv/jdk"
)

// jdk17Differs are javaFloat's texts of values that JDK 17 and 18 (the old
// FloatingDecimal) print otherwise (9.999999999999999E22, 1.0E-323): JDK 19
// on prints what javaFloat does. docs/debezium.md names them as a
// JVM-dependent gap.
var jdk17Differs = map[string]bool{"1.0E23": true, "2.0E23": true, "1.1754944E-38": true, "9.9E-324": true}

// TestJavaFloat runs Java's own Double.toString and Float.toString on edge
// values (subnormals, the plain/scientific boundaries, shortest-repr cases)
// and compares javaFloat's text with each, for the java command and every
// JDK in /usr/lib/jvm. It skips only without a java command (CI installs one
// for Debezium).
func TestJavaFloat(t *testing.T) {
	java, err := exec.LookPath("java")
	if err != nil {
		t.Skip("no java command: install a JDK to compare with Java's Double.toString")
	}
	javas := []string{java}
	seen := map[string]bool{}
	if p, err := filepath.EvalSymlinks(java); err == nil {
		seen[p] = true
	}
	others, _ := filepath.Glob("/usr/lib/jvm/*/bin/java")
	for _, j := range others {
		if p, err := filepath.EvalSymlinks(j); err == nil && !seen[p] {
			seen[p] = true
			javas = append(javas, j)
		}
	}
	for _, j := range javas {
		t.Run(strings.ReplaceAll(j, "/", "_"), func(t *testing.T) { compareJavaFloat(t, j) })
	}
}

func compareJavaFloat(t *testing.T, java string) {
	doubles := []float64{4.9e-324, 1e23, 2e23, 0.001, 1e-4, 1e7, 9999999, 0.1, 123456789012345680, math.MaxFloat64,
		2.2250738585072014e-308, 100, 1.5, -1e-7, 1e21, 0.3, 123.456, 0.003, 5e-5, 1e-5, 9.999999999999999e22, 0.0009999, 1234567.125, 1e-323}
	floats := []float32{1.4e-45, 1.17549435e-38, math.MaxFloat32, 1e7, 9999999, 0.001, 1e-4, 0.3, 16777217, 1e10, -0.25, -0.1, 0.1, 33.3, 2.8e-45, 1e-3, 9.999999e6}
	var src strings.Builder
	src.WriteString("public class F { public static void main(String[] a) {\n")
	for _, d := range doubles {
		src.WriteString("System.out.println(Double.toString(Double.longBitsToDouble(0x" + strconv.FormatUint(math.Float64bits(d), 16) + "L)));\n")
	}
	for _, f := range floats {
		src.WriteString("System.out.println(Float.toString(Float.intBitsToFloat(0x" + strconv.FormatUint(uint64(math.Float32bits(f)), 16) + ")));\n")
	}
	src.WriteString("System.out.println(Runtime.version().feature()); }}\n")
	lines := jdk.Run(t, java, "F", src.String())
	if len(lines) != len(doubles)+len(floats)+1 {
		t.Fatalf("java printed %d lines; want %d:\n%s", len(lines), len(doubles)+len(floats)+1, strings.Join(lines, "\n"))
	}
	feature, _ := strconv.Atoi(lines[len(lines)-1])
	check := func(i int, got string, v any) {
		if got == lines[i] {
			return
		}
		if feature < 19 && jdk17Differs[got] {
			t.Logf("%v: Java %d prints %s, javaFloat (JDK 19 on) %s: the documented JVM-dependent gap", v, feature, lines[i], got)
			return
		}
		t.Errorf("%v: Java %d prints %s; javaFloat %s", v, feature, lines[i], got)
	}
	for i, d := range doubles {
		check(i, javaFloat(d, 64), d)
	}
	for i, f := range floats {
		check(len(doubles)+i, javaFloat(float64(f), 32), f)
	}
}
