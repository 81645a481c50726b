package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/viper"
)

// Secrets: where the passwords come from and how they reach the clients.
//
// The Postgres password comes from, in this order: postgres.password_file, the
// environment variable RELAY_POSTGRES_PASSWORD, the DSN itself (works, but
// discouraged: the DSN is often copied around), and then pgx's own fallbacks,
// PGPASSWORD and the passfile (~/.pgpass). A password in the DSN together with
// a password file or RELAY_POSTGRES_PASSWORD is an error rather than a silent
// choice. The Kafka SASL password comes from kafka.sasl.password_file or
// kafka.sasl.password (RELAY_KAFKA_SASL_PASSWORD; in the file, discouraged).
//
// Invariant: no output is produced by searching text for a secret. Secrets are
// kept out of output where they are: the DSN is only ever printed through
// redactDSN, which renders the parsed configuration and never the string; a
// DSN that cannot be parsed is shown only up to its user name; the SASL
// password is never put into a message. A log handler that rewrote words that
// looked like the password hid slot and topic names containing it and still
// missed the password where the text was not split the way it guessed.

// postgresRelayPasswordEnv is read directly, not through a config key:
// postgres.password must not be a key of the config file.
const postgresRelayPasswordEnv = "RELAY_POSTGRES_PASSWORD"

const postgresPasswordKeyMsg = `postgres.password is not a config key: keep passwords out of the config file; ` +
	`set postgres.password_file to a file holding only the password (a Kubernetes secret volume, say), ` +
	`or the environment variable ` + postgresRelayPasswordEnv

// readSecretFile reads a *_file key's file: its content less one trailing
// newline (Kubernetes secrets and `echo pw > file` end with one; a password
// may still end with other white space). The error names the key and the path,
// never the content.
func readSecretFile(key, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: cannot read it: %w", key, err)
	}
	s := string(b)
	if t, ok := strings.CutSuffix(s, "\n"); ok {
		s = strings.TrimSuffix(t, "\r")
	}
	if s == "" {
		return "", fmt.Errorf("%s: %s is empty; write the password into it (one trailing newline is ignored)", key, path)
	}
	return s, nil
}

// applyPostgresPassword puts the password from postgres.password_file or
// RELAY_POSTGRES_PASSWORD into c.Replication.DSN and, when set,
// c.Replication.ReplicationDSN, which checkDSN has accepted.
func (c *config) applyPostgresPassword() error {
	envPW, fromEnv := os.LookupEnv(postgresRelayPasswordEnv)
	fromEnv = fromEnv && envPW != ""
	if c.PasswordFile == "" && !fromEnv {
		return nil // the DSN's own password, PGPASSWORD or ~/.pgpass
	}
	if c.PasswordFile != "" && fromEnv {
		return fmt.Errorf("postgres.password_file: set, and so is %s; keep one of them", postgresRelayPasswordEnv)
	}
	source, pw := postgresRelayPasswordEnv, envPW
	if c.PasswordFile != "" {
		source = "postgres.password_file"
		var err error
		if pw, err = readSecretFile(source, c.PasswordFile); err != nil {
			return err
		}
	}
	// The same password serves the replication connection's DSN, when it
	// has one of its own (postgres.replication_dsn): the same role.
	for _, d := range []struct {
		key string
		dsn *string
	}{{"postgres.dsn", &c.Replication.DSN}, {"postgres.replication_dsn", &c.Replication.ReplicationDSN}} {
		if *d.dsn == "" {
			continue
		}
		has, err := dsnHasPassword(*d.dsn)
		if err != nil {
			return err
		}
		if has {
			return fmt.Errorf("%s: holds a password, and %s is set too; remove the password from the DSN (recommended) or unset %s", d.key, source, source)
		}
		dsn, err := withPassword(*d.dsn, pw)
		if err != nil {
			return fmt.Errorf("%s: %w", source, err)
		}
		*d.dsn = dsn
	}
	return nil
}

// withEnvPassword is a DSN given on the command line (migrate's
// --postgres-dsn) with RELAY_POSTGRES_PASSWORD added, as postgres.dsn gets it:
// the same variable serves every connection the operator asks for. A
// password in the DSN itself wins, as it does for PGPASSWORD.
func withEnvPassword(dsn string) (string, error) {
	pw := os.Getenv(postgresRelayPasswordEnv)
	if pw == "" {
		return dsn, nil
	}
	if err := checkDSN(dsn); err != nil {
		return "", err
	}
	if has, err := dsnHasPassword(dsn); err != nil || has {
		return dsn, err
	}
	out, err := withPassword(dsn, pw)
	if err != nil {
		return "", fmt.Errorf("%s: %w", postgresRelayPasswordEnv, err)
	}
	return out, nil
}

// applySASLPassword reads kafka.sasl.password_file into c.Sink.SASL.Password.
func (c *config) applySASLPassword() error {
	if c.SASLPasswordFile == "" {
		return nil
	}
	if c.Sink.SASL.Password != "" {
		return errors.New("kafka.sasl.password_file: set, and so is kafka.sasl.password (RELAY_KAFKA_SASL_PASSWORD or the config file); keep one of them")
	}
	pw, err := readSecretFile("kafka.sasl.password_file", c.SASLPasswordFile)
	if err != nil {
		return err
	}
	c.Sink.SASL.Password = pw
	return nil
}

// noPassword stands for "the DSN sets no password" in dsnHasPassword: the
// DSN's own setting, if any, comes later and wins.
const noPassword = "outbox-relay:no-password-in-dsn"

// dsnHasPassword reports whether dsn, which checkDSN accepted, sets a
// password itself (not PGPASSWORD, not ~/.pgpass).
func dsnHasPassword(dsn string) (bool, error) {
	if isURLDSN(dsn) {
		u := splitURLDSN(dsn)
		if _, pw, ok := strings.Cut(u.userinfo, ":"); ok && pw != "" {
			return true, nil
		}
		for _, kv := range strings.Split(u.query, "&") {
			k, v, _ := strings.Cut(kv, "=")
			if k == "password" && v != "" {
				return true, nil
			}
		}
		return false, nil
	}
	// Keyword/value settings: the last occurrence of a key wins, so a
	// password the DSN sets replaces the one put in front of it.
	pc, err := pgconn.ParseConfig("password=" + noPassword + " " + dsn)
	if err != nil {
		return false, dsnError(dsn, "")
	}
	return pc.Password != noPassword, nil
}

// withPassword returns dsn with password set as one more parameter, in the
// DSN's own syntax; pgconn takes the last setting of a key. It checks the
// result by parsing it, so that a password the syntax cannot carry is an
// error here, not a failed login later.
func withPassword(dsn, password string) (string, error) {
	var out string
	if isURLDSN(dsn) {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		out = dsn + sep + "password=" + percentEncode(password)
	} else {
		out = dsn + " password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(password) + "'"
	}
	pc, err := pgconn.ParseConfig(out)
	if err != nil || pc.Password != password {
		// The parse error would quote the password: leave it out.
		return "", errors.New("the password cannot be used in a connection string (does it hold a NUL byte?)")
	}
	return out, nil
}

// percentEncode escapes every byte but RFC 3986's unreserved characters:
// pgconn decodes percent escapes in URL parameters but, like libpq, reads '+'
// as itself, so url.QueryEscape's '+' for a space would change the password.
func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// fileSecrets returns the secrets the config file raw holds itself (the
// environment aside): the value of each secret setting (kind secret:
// kafka.sasl.password) it sets, and postgres.dsn when the DSN it sets holds
// a password. For check's warning about a file others may read.
func fileSecrets(raw []byte) []string {
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(raw)); err != nil {
		return nil // loadConfig reports it
	}
	var keys []string
	for _, s := range settings {
		if s.kind == secret && v.GetString(s.key) != "" {
			keys = append(keys, s.key)
		}
	}
	for _, key := range []string{"postgres.dsn", "postgres.replication_dsn"} {
		if dsn := v.GetString(key); dsn != "" {
			if has, err := dsnHasPassword(dsn); err == nil && has {
				keys = append(keys, key)
			}
		}
	}
	return keys
}

// secretElsewhere says where each secret a config file may hold belongs
// instead.
var secretElsewhere = map[string]string{
	"kafka.sasl.password":      "put kafka.sasl.password in kafka.sasl.password_file or RELAY_KAFKA_SASL_PASSWORD instead",
	"postgres.dsn":             "move the DSN's password to postgres.password_file or " + postgresRelayPasswordEnv,
	"postgres.replication_dsn": "move the DSN's password to postgres.password_file or " + postgresRelayPasswordEnv,
}

// configFileWarning returns check's warning when the config file holds
// secrets (fileSecrets) and its mode lets its group or others read it; ""
// otherwise, and when the file cannot be looked at (loadConfig read it).
func configFileWarning(file string, secrets []string) string {
	if file == "" || len(secrets) == 0 {
		return ""
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm()&0o044 == 0 {
		return ""
	}
	var moves []string
	for _, k := range secrets {
		moves = append(moves, secretElsewhere[k])
	}
	return fmt.Sprintf("%s (mode %04o) is readable by its group or others and holds %s: chmod 600 %s, or %s",
		file, fi.Mode().Perm(), strings.Join(secrets, " and "), file, strings.Join(moves, ", and "))
}
