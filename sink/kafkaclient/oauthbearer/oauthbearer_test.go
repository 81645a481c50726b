package oauthbearer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// jwt is an unsigned JWT with claims.
func jwt(t *testing.T, claims map[string]any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc(b) + "."
}

// padPayload adds base64 padding to a JWT's payload, as some issuers do.
func padPayload(token string) string {
	parts := strings.Split(token, ".")
	for len(parts[1])%4 != 0 {
		parts[1] += "="
	}
	return strings.Join(parts, ".")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestExpiry(t *testing.T) {
	exp := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name    string
		token   string
		want    time.Time
		wantErr string
	}{
		{"integer exp", jwt(t, map[string]any{"sub": "relay", "exp": exp.Unix()}), exp, ""},
		{"fractional exp", jwt(t, map[string]any{"exp": float64(exp.Unix()) + 0.5}), exp.Add(500 * time.Millisecond), ""},
		{"no exp", jwt(t, map[string]any{"sub": "relay"}), time.Time{}, ""},
		{"padded payload", padPayload(jwt(t, map[string]any{"exp": exp.Unix()})), exp, ""},
		{"opaque token", "2YotnFZFEjr1zCsicMWpAA", time.Time{}, ""},
		{"opaque token with dots", "a.b.c", time.Time{}, ""},
		{"exp a word", jwt(t, map[string]any{"exp": "tomorrow"}), time.Time{}, `exp claim is "tomorrow", not a number`},
		{"exp negative", jwt(t, map[string]any{"exp": -5}), time.Time{}, "not a positive number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Expiry(tt.token)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "identity provider") {
					t.Fatalf("Expiry(%q) = %v, %v; want an error with %q naming the identity provider", tt.token, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !got.Equal(tt.want) {
				t.Errorf("Expiry(%q) = %v, %v; want %v", tt.token, got, err, tt.want)
			}
		})
	}
}

func TestNewInvalid(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"nothing", Config{}, "name the file that holds the token or a command that prints it"},
		{"both", Config{File: "/t", Command: "echo t"}, "keep one"},
		{"negative margin", Config{File: "/t", Margin: -time.Second}, "use 0 or more"},
		{"negative timeout", Config{Command: "echo t", Timeout: -time.Second}, "use 0 for the default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New(%+v) = %v; want an error with %q", tt.cfg, err, tt.want)
			}
		})
	}
}

// A file is read for every token: a rotated file (Kubernetes writes a new projected
// token well before the old one expires) is used at the next connection.
func TestFileReread(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	first := jwt(t, map[string]any{"sub": "relay", "exp": time.Now().Add(time.Hour).Unix()})
	writeFile(t, path, first+"\n")
	s, err := New(Config{File: path})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got, err := s.Token(ctx); err != nil || got != first {
		t.Fatalf("Token = %q, %v; want the file's token %q", got, err, first)
	}
	second := jwt(t, map[string]any{"sub": "relay", "exp": time.Now().Add(2 * time.Hour).Unix()})
	// As the kubelet does: a new file renamed over the old one.
	writeFile(t, path+".new", second)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Token(ctx); err != nil || got != second {
		t.Fatalf("Token after the file was rotated = %q, %v; want the new token %q", got, err, second)
	}
	// An opaque token (no JWT) is passed on as it is.
	writeFile(t, path, "  opaque-token  ")
	if got, err := s.Token(ctx); err != nil || got != "opaque-token" {
		t.Fatalf("Token of an opaque token = %q, %v; want %q", got, err, "opaque-token")
	}
}

func TestFileErrors(t *testing.T) {
	dir := t.TempDir()
	expired := filepath.Join(dir, "expired")
	writeFile(t, expired, jwt(t, map[string]any{"sub": "relay", "exp": time.Now().Add(-time.Minute).Unix()}))
	empty := filepath.Join(dir, "empty")
	writeFile(t, empty, "\n")
	badExp := filepath.Join(dir, "bad-exp")
	writeFile(t, badExp, jwt(t, map[string]any{"exp": true}))
	tests := []struct {
		name string
		file string
		want []string // each in the error
	}{
		{"missing", filepath.Join(dir, "missing"), []string{filepath.Join(dir, "missing"), "no such file", "must exist and be readable", "mountPath"}},
		{"empty", empty, []string{empty, "is empty", "has not written a token yet"}},
		{"expired", expired, []string{expired, "token expired at", "must be rewritten before its token expires"}},
		{"malformed exp", badExp, []string{badExp, "exp claim is true", "malformed token"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{File: tt.file})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Token(context.Background())
			if err == nil {
				t.Fatalf("Token = nil error; want one with %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Token = %q; want %q in it", err, w)
				}
			}
			if tt.name == "expired" && !errors.Is(err, ErrExpired) {
				t.Errorf("Token = %v; want it to wrap ErrExpired", err)
			}
		})
	}
}

// A command runs once while its token is valid beyond the margin, and again when
// the token comes within the margin of its exp.
func TestCommandRefreshedBeforeExpiry(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	token := jwt(t, map[string]any{"sub": "relay", "exp": time.Now().Add(10 * time.Minute).Unix()})
	// Each run appends a line to runs and prints the token of the file "next".
	writeFile(t, filepath.Join(dir, "next"), token)
	cmd := "echo run >> '" + runs + "'; echo 'a message for the log' >&2; cat '" + filepath.Join(dir, "next") + "'"
	s, err := New(Config{Command: cmd, Margin: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	s.now = func() time.Time { return now }
	ctx := context.Background()
	countRuns := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "run")
	}
	for i := 0; i < 3; i++ {
		if got, err := s.Token(ctx); err != nil || got != token {
			t.Fatalf("Token #%d = %q, %v; want %q", i, got, err, token)
		}
	}
	if n := countRuns(); n != 1 {
		t.Fatalf("the command ran %d times for 3 tokens while its token was valid; want 1", n)
	}
	// 8 minutes on: 2 minutes left, outside the margin of 1: the cached token.
	now = now.Add(8 * time.Minute)
	if _, err := s.Token(ctx); err != nil || countRuns() != 1 {
		t.Fatalf("Token 2 minutes before exp: %v, %d runs; want the cached token, 1 run", err, countRuns())
	}
	// 9.5 minutes on: within the margin, the command runs again.
	now = now.Add(90 * time.Second)
	fresh := jwt(t, map[string]any{"sub": "relay", "exp": now.Add(10 * time.Minute).Unix()})
	writeFile(t, filepath.Join(dir, "next"), fresh)
	if got, err := s.Token(ctx); err != nil || got != fresh {
		t.Fatalf("Token within the margin = %q, %v; want the command's new token", got, err)
	}
	if n := countRuns(); n != 2 {
		t.Errorf("the command ran %d times; want 2", n)
	}
}

// A token without an exp this package can read (opaque, or a JWT without exp) is
// asked for again every time: nothing says how long it lasts.
func TestCommandWithoutExpiryRunsEachTime(t *testing.T) {
	runs := filepath.Join(t.TempDir(), "runs")
	s, err := New(Config{Command: "echo run >> '" + runs + "'; echo opaque"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if got, err := s.Token(context.Background()); err != nil || got != "opaque" {
			t.Fatalf("Token = %q, %v; want %q", got, err, "opaque")
		}
	}
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 2 {
		t.Errorf("the command ran %d times for 2 tokens; want 2", strings.Count(string(b), "run"))
	}
}

func TestCommandErrors(t *testing.T) {
	expired := jwt(t, map[string]any{"sub": "relay", "exp": time.Now().Add(-time.Hour).Unix()})
	tests := []struct {
		name    string
		command string
		timeout time.Duration
		want    []string
	}{
		{"fails", "echo 'invalid_client: the secret is wrong' >&2; exit 3", 0,
			[]string{"failed: exit status 3", `its standard error: "invalid_client: the secret is wrong"`, "run it by hand"}},
		{"not found", "no-such-token-tool-xyz", 0, []string{"exit status 127", "not found", "run it by hand"}},
		{"prints nothing", "echo only on stderr >&2", 0, []string{"printed nothing on its standard output", "only on stderr", "must print the token"}},
		{"prints more than a token", "echo Your token is: abc", 0, []string{"printed more than a token", "messages go to standard error"}},
		{"slow", "sleep 5; echo late", 200 * time.Millisecond, []string{"did not finish within 200ms", "raise its timeout"}},
		{"expired", "echo " + expired, 0, []string{"token expired at", "must issue a fresh one"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Command: tt.command, Timeout: tt.timeout})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = s.Token(context.Background())
			if err == nil {
				t.Fatalf("Token = nil error; want one with %q", tt.want)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("Token took %s; want the timeout to stop the command", took)
			}
			for _, w := range append(tt.want, tt.command) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Token = %q; want %q in it", err, w)
				}
			}
		})
	}
}
