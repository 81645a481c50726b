// Package jdk runs Java programs for tests that compare the relay's output
// with what Java itself prints (the texts Kafka Connect and Debezium write).
package jdk

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Run writes src, a Java program in one source file whose public class is
// class, to the test's temporary directory, runs it with the java command
// java (source-file mode, JDK 11 on) and returns the lines it printed,
// stderr included. A program that does not compile or run fails the test.
func Run(t testing.TB, java, class, src string) []string {
	t.Helper()
	file := filepath.Join(t.TempDir(), class+".java")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(java, file).CombinedOutput()
	if err != nil {
		t.Fatalf("java %s: %v\n%s", file, err, out)
	}
	var lines []string
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		lines = append(lines, sc.Text())
	}
	return lines
}
