package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// redacted stands for a password that is set, in a rendered DSN.
const redacted = "xxxxx"

// redactDSN renders dsn for messages from its parsed configuration: user,
// hosts, ports and database, and xxxxx where a password is set (from the DSN,
// a password file or PGPASSWORD). Nothing of the string itself is copied, so
// nothing it holds beyond those fields can show. A DSN that does not parse is
// shown up to its user name (validate has refused it long before).
func redactDSN(dsn string) string {
	if checkURLShape(dsn) != nil {
		return dsnPrefix(dsn)
	}
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return dsnPrefix(dsn)
	}
	u := url.URL{Scheme: "postgres", Path: "/" + pc.Database}
	if pc.Password != "" {
		u.User = url.UserPassword(pc.User, redacted)
	} else if pc.User != "" {
		u.User = url.User(pc.User)
	}
	var hosts []string
	for _, h := range append([]*pgconn.FallbackConfig{{Host: pc.Host, Port: pc.Port}}, pc.Fallbacks...) {
		if strings.HasPrefix(h.Host, "/") { // a Unix socket directory
			q := u.Query()
			q.Set("host", h.Host)
			u.RawQuery = q.Encode()
			continue
		}
		hp := net.JoinHostPort(h.Host, strconv.Itoa(int(h.Port)))
		if len(hosts) == 0 || hosts[len(hosts)-1] != hp { // TLS fallbacks repeat the host
			hosts = append(hosts, hp)
		}
	}
	u.Host = strings.Join(hosts, ",")
	return u.String()
}

// checkDSN rejects a DSN that pgconn cannot parse, and a URL whose shape
// shows an unencoded password: pgconn (like libpq) ends the user information
// at the first '@', so postgres://u:abc@def/ghi@host/db would log in with the
// password "abc" at the host "def", putting part of the password in front of
// DNS. Its errors show the DSN only up to the user name.
func checkDSN(dsn string) error {
	if err := checkURLShape(dsn); err != nil {
		return err
	}
	if _, err := pgconn.ParseConfig(dsn); err != nil {
		return dsnError(dsn, parseDetail(dsn))
	}
	return nil
}

// checkURLShape refuses a URL DSN whose user information ends somewhere
// other than where its writer meant.
func checkURLShape(dsn string) error {
	if isURLDSN(dsn) {
		u := splitURLDSN(dsn)
		if strings.ContainsAny(u.userinfo, "?") || strings.Contains(u.rest, "@") {
			return fmt.Errorf("postgres.dsn: `%s` has an '@' or '?' where a URL has none: a password holding '@', '/', '?' or '%%' must be "+
				"URL-encoded ('@' as %%40, '/' as %%2F, '?' as %%3F, '%%' as %%25), or leave the password out of the DSN "+
				"and set postgres.password_file or %s", dsnPrefix(dsn), postgresRelayPasswordEnv)
		}
	}
	return nil
}

// dsnError says that dsn cannot be parsed, with detail if known to be safe.
func dsnError(dsn, detail string) error {
	if detail != "" {
		detail = " (" + detail + ")"
	}
	if isURLDSN(dsn) {
		return fmt.Errorf("postgres.dsn: `%s` cannot be parsed as a connection URL%s: check the host, port and parameters; "+
			"URL-encode special characters in the password ('@' as %%40, '/' as %%2F, '?' as %%3F, '%%' as %%25), "+
			"or leave the password out of the DSN and set postgres.password_file or %s", dsnPrefix(dsn), detail, postgresRelayPasswordEnv)
	}
	return fmt.Errorf("postgres.dsn: `%s` cannot be parsed as keyword/value settings%s: write each as key=value, "+
		`put a value holding spaces in single quotes (with \' and \\ for a quote and a backslash), check the port and parameters; `+
		"or leave the password out of the DSN and set postgres.password_file or %s", dsnPrefix(dsn), detail, postgresRelayPasswordEnv)
}

// parseDetail returns pgconn's reason for refusing dsn, taken from a copy
// with every password removed, or "" when the password cannot be located
// for certain: then no part of pgconn's message is safe to show.
func parseDetail(dsn string) string {
	var stripped string
	if isURLDSN(dsn) {
		u := splitURLDSN(dsn)
		for _, kv := range strings.Split(u.query, "&") {
			if k, _, _ := strings.Cut(kv, "="); strings.Contains(strings.ToLower(k), "password") {
				return "" // an unencoded '&' would split the password
			}
		}
		stripped = u.scheme
		if u.userinfo != "" {
			user, _, _ := strings.Cut(u.userinfo, ":")
			stripped += user + "@"
		}
		stripped += u.rest
	} else {
		toks, ok := keywordValueTokens(dsn)
		if !ok {
			return ""
		}
		var keep []string
		for _, t := range toks {
			if !strings.Contains(strings.ToLower(t.key), "password") {
				keep = append(keep, t.raw)
			}
		}
		stripped = strings.Join(keep, " ")
	}
	_, err := pgconn.ParseConfig(stripped)
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return "" // the password itself was the trouble
	}
	msg, ok := strings.CutPrefix(err.Error(), "cannot parse `"+stripped+"`: ")
	if !ok {
		return ""
	}
	return msg
}

// A urlDSN is a postgres:// DSN cut as pgconn and libpq cut it: the user
// information ends at the first '@' that comes before any '/'.
type urlDSN struct {
	scheme   string // "postgres://" or "postgresql://"
	userinfo string // user[:password], without the '@'; "" if none
	rest     string // hosts and database, up to the '?'
	query    string // after the '?'
}

func isURLDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

func splitURLDSN(dsn string) urlDSN {
	var u urlDSN
	i := strings.Index(dsn, "://") + 3
	u.scheme, dsn = dsn[:i], dsn[i:]
	if j := strings.IndexAny(dsn, "@/"); j >= 0 && dsn[j] == '@' {
		u.userinfo, dsn = dsn[:j], dsn[j+1:]
	}
	u.rest, u.query, _ = strings.Cut(dsn, "?")
	return u
}

// dsnPrefix is what may be shown of a DSN that may not parse: a URL up to its
// user name, keyword/value settings up to user=.
func dsnPrefix(dsn string) string {
	if isURLDSN(dsn) {
		i := strings.Index(dsn, "://") + 3
		end := strings.IndexAny(dsn[i:], ":@/?#,")
		switch {
		case end < 0:
			return dsn
		case dsn[i+end] == ':':
			return dsn[:i+end] + ":…"
		}
		return dsn[:i+end] + "…"
	}
	var shown []string
	for _, f := range strings.Fields(dsn) {
		m := safeSetting.FindStringSubmatch(f)
		if m == nil {
			break
		}
		shown = append(shown, f)
		if m[1] == "user" {
			break
		}
	}
	return strings.Join(append(shown, "…"), " ")
}

// safeSetting is a keyword/value setting shown by dsnPrefix: a plain value of
// a key that is never a secret.
var safeSetting = regexp.MustCompile(`^(host|hostaddr|port|dbname|user)=([^\s'\\]*)$`)

type kvToken struct{ key, raw string }

// keywordValueTokens splits keyword/value settings as pgconn does, keeping
// each setting's text; ok is false where pgconn's tokenizer would fail.
func keywordValueTokens(s string) (toks []kvToken, ok bool) {
	s = strings.TrimLeft(s, " \t\n\r\v\f")
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, false
		}
		key := strings.TrimSpace(s[:eq])
		if key == "" || strings.ContainsAny(key, " \t\n\r\v\f") {
			return nil, false
		}
		i := eq + 1
		for i < len(s) && strings.IndexByte(" \t\n\r\v\f", s[i]) >= 0 {
			i++
		}
		if i < len(s) && s[i] == '\'' {
			i++
			for ; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			if i >= len(s) {
				return nil, false
			}
			i++
		} else {
			for ; i < len(s) && strings.IndexByte(" \t\n\r\v\f", s[i]) < 0; i++ {
				if s[i] == '\\' {
					i++
				}
			}
			i = min(i, len(s))
		}
		toks = append(toks, kvToken{key: key, raw: s[:i]})
		s = strings.TrimLeft(s[i:], " \t\n\r\v\f")
	}
	return toks, true
}

// newLogger returns the process logger. It writes what it is given: secrets
// are kept out of log records where they live (redactDSN, the SASL password
// never passed), not found again in the text.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	lvl, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: lvl}
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
