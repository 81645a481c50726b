package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

const redacted = "xxxxx"

// kvPassword matches password=... in a keyword/value DSN, quoted or not.
var kvPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]*)`)

// urlPassword matches the password of a postgres:// URL that net/url cannot
// parse (a bad port, say): such a DSN still reaches error messages.
var urlPassword = regexp.MustCompile(`^(postgres(?:ql)?://[^:/@?#]*:)([^@/?#]*)@`)

// redactDSN hides the password of a URL or keyword/value DSN, for logs.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		if q.Has("password") {
			q.Set("password", redacted)
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	if urlPassword.MatchString(dsn) {
		return urlPassword.ReplaceAllString(dsn, "${1}"+redacted+"@")
	}
	return kvPassword.ReplaceAllString(dsn, "${1}"+redacted)
}

// dsnPassword returns the password written in dsn, or "".
func dsnPassword(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if p, ok := u.User.Password(); ok {
			return p
		}
		return u.Query().Get("password")
	}
	if m := urlPassword.FindStringSubmatch(dsn); m != nil {
		if p, err := url.PathUnescape(m[2]); err == nil {
			return p
		}
		return m[2]
	}
	m := kvPassword.FindStringSubmatch(dsn)
	if m == nil {
		return ""
	}
	p := m[2]
	if len(p) >= 2 && p[0] == '\'' {
		p = strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(p[1 : len(p)-1])
	}
	return p
}

// A scrubber replaces known secrets, in every spelling they may take in a
// DSN, wherever they occur as a token: the last line of defence for error
// texts of libraries that echo what they were given. An occurrence inside a
// longer word is left alone: a short password such as "relay" must not turn
// the slot outbox_relay into outbox_xxxxx, and a word that merely contains
// the secret does not reveal it.
type scrubber struct{ forms []string }

func newScrubber(secrets ...string) scrubber {
	var forms []string
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for _, form := range []string{s, url.QueryEscape(s), url.PathEscape(s), url.UserPassword("", s).String()[1:]} {
			if !slices.Contains(forms, form) {
				forms = append(forms, form)
			}
		}
	}
	// Longest first, so that a form containing another is replaced whole.
	slices.SortFunc(forms, func(a, b string) int { return len(b) - len(a) })
	return scrubber{forms: forms}
}

func (s scrubber) String(x string) string {
	for _, form := range s.forms {
		x = replaceToken(x, form, redacted)
	}
	return x
}

// replaceToken replaces each occurrence of old in s that is not preceded or
// followed by a letter, digit or underscore.
func replaceToken(s, old, repl string) string {
	var b strings.Builder
	for i := 0; ; {
		j := strings.Index(s[i:], old)
		if j < 0 {
			if b.Len() == 0 {
				return s
			}
			b.WriteString(s[i:])
			return b.String()
		}
		j += i
		end := j + len(old)
		if (j > 0 && isWordByte(s[j-1]) && isWordByte(old[0])) ||
			(end < len(s) && isWordByte(s[end]) && isWordByte(old[len(old)-1])) {
			b.WriteString(s[i : j+1])
			i = j + 1
			continue
		}
		b.WriteString(s[i:j])
		b.WriteString(repl)
		i = end
	}
}

func isWordByte(c byte) bool {
	return c == '_' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// scrubbedError keeps the chain (errors.Is still sees context.Canceled) but
// prints without secrets.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

func (s scrubber) Error(err error) error {
	if err == nil {
		return nil
	}
	return &scrubbedError{msg: s.String(err.Error()), err: err}
}

// newLogger returns the process logger. Every string and error it prints
// passes through scrub, including the relay's own log lines.
func newLogger(w io.Writer, level, format string, scrub scrubber) (*slog.Logger, error) {
	lvl, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{
		Level: lvl,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Value.Kind() {
			case slog.KindString:
				return slog.String(a.Key, scrub.String(a.Value.String()))
			case slog.KindAny:
				switch v := a.Value.Any().(type) {
				case error:
					return slog.String(a.Key, scrub.String(v.Error()))
				case fmt.Stringer:
					return slog.String(a.Key, scrub.String(v.String()))
				case []string:
					out := make([]string, len(v))
					for i, s := range v {
						out[i] = scrub.String(s)
					}
					return slog.Any(a.Key, out)
				}
			}
			return a
		},
	}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q is not text or json", format)
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
	}
	return l, nil
}

// isCanceled reports whether err is the clean-shutdown error of a cancelled ctx.
func isCanceled(ctx context.Context, err error) bool {
	return ctx.Err() != nil && errors.Is(err, context.Canceled)
}
