package main

import (
	"bytes"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// hostilePassword has every character a DSN gives a meaning to.
const hostilePassword = `p@ss/w:rd%?#& +x'"\=`

// passwordForms are the spellings of pw a program might print.
func passwordForms(pw string) []string {
	forms := []string{pw, url.QueryEscape(pw), url.PathEscape(pw), url.UserPassword("u", pw).String()[2:], percentEncode(pw)}
	return forms
}

func TestCheckDSN(t *testing.T) {
	tests := []struct {
		name, dsn string
		wantErr   string // "" for accepted
		secrets   []string
	}{
		{"url", "postgres://relay:hunter2@db:5432/app?sslmode=disable", "", nil},
		{"url encoded password", "postgres://relay:p%40ss%2Fw@db/app", "", nil},
		{"keyword/value", "host=db user=relay password='p@ss w\\'d' dbname=app", "", nil},
		{"unencoded @ (issue 14)", "postgres://u:abc@def/ghi@host/db",
			"postgres.dsn: `postgres://u:…` has an '@' or '?' where a URL has none", []string{"abc", "def", "ghi"}},
		{"unencoded / and @", "postgres://u:ab/cd@host/db", "`postgres://u:…` has an '@'", []string{"ab/cd", "cd@"}},
		{"unencoded ?", "postgres://u:ab?cd@host/db", "`postgres://u:…` has an '@' or '?'", []string{"ab", "cd"}},
		{"@ in query before userinfo", "postgres://host?password=qq7@zz9", "`postgres://host…` has an '@'", []string{"qq7", "zz9"}},
		{"bad escape", "postgres://u:ab%zzcd@host/db", "`postgres://u:…` cannot be parsed as a connection URL", []string{"ab", "zzcd"}},
		{"bad port", "postgres://relay:s3cr3t@db:notaport/app", "`postgres://relay:…` cannot be parsed as a connection URL (invalid port)", []string{"s3cr3t", "notaport", "db:"}},
		{"password in query and bad port", "postgres://relay@db:x/app?password=s3&cr3t", "`postgres://relay…` cannot be parsed as a connection URL:", []string{"s3", "cr3t"}},
		{"keyword/value unterminated", "host=db user=relay password='s3cr3t dbname=app", "`host=db user=relay …` cannot be parsed as keyword/value settings:", []string{"s3cr3t", "dbname"}},
		{"keyword/value bad port", "user=relay password=s3cr3t port=x", "`user=relay …` cannot be parsed as keyword/value settings (invalid port)", []string{"s3cr3t"}},
		{"keyword/value password first", "password=s3cr3t user=relay port=x", "`…` cannot be parsed", []string{"s3cr3t", "relay"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkDSN(tt.dsn)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("checkDSN(%q) = %v; want nil", tt.dsn, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("checkDSN(%q) = %v; want an error containing %q", tt.dsn, err, tt.wantErr)
			}
			for _, s := range tt.secrets {
				if strings.Contains(err.Error(), s) {
					t.Errorf("checkDSN(%q) = %v; shows %q, which comes after the user name", tt.dsn, err, s)
				}
			}
		})
	}
}

// passwordlessEnv is a clean configuration of dsn, a password in none of
// the places the relay or libpq would find one, and a broker address.
func passwordlessEnv(t *testing.T, dsn string) {
	t.Helper()
	cleanEnv(t)
	unsetenv(t, postgresRelayPasswordEnv)
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGPASSFILE", "/nonexistent")
	t.Setenv("RELAY_POSTGRES_DSN", dsn)
	t.Setenv("RELAY_KAFKA_BROKERS", "k:9092")
}

func TestRedactDSN(t *testing.T) {
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGPASSFILE", "/nonexistent")
	tests := []struct{ in, want string }{
		{"postgres://relay:hunter2@db:5432/app", "postgres://relay:xxxxx@db:5432/app"},
		{"postgresql://relay@db/app?password=hunter2&sslmode=disable", "postgres://relay:xxxxx@db:5432/app"},
		{"host=db user=relay password='hun ter\\'2' dbname=app sslmode=disable", "postgres://relay:xxxxx@db:5432/app"},
		{"host=db user=relay dbname=app sslmode=disable", "postgres://relay@db:5432/app"},
		{"postgres://relay@h1:5433,h2/app?sslmode=disable", "postgres://relay@h1:5433,h2:5432/app"},
		{"host=/run/postgresql user=relay dbname=app", "postgres://relay@/app?host=%2Frun%2Fpostgresql"},
		{"postgres://relay:hunter2@db:notaport/app", "postgres://relay:…"},
		{"postgres://u:abc@def/ghi@host/db", "postgres://u:…"},
	}
	for _, tt := range tests {
		if got := redactDSN(tt.in); got != tt.want {
			t.Errorf("redactDSN(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestPasswordSources(t *testing.T) {
	pwFile := writeFile(t, "pg-password", hostilePassword+"\n")
	saslFile := writeFile(t, "sasl-password", "sasl "+hostilePassword+"\r\n")
	emptyFile := writeFile(t, "empty", "\n")
	tests := []struct {
		name    string
		env     map[string]string
		wantPG  string // the password pgconn reads from the effective DSN
		wantErr string
	}{
		{"url dsn and password_file", map[string]string{"RELAY_POSTGRES_PASSWORD_FILE": pwFile}, hostilePassword, ""},
		{"url dsn with a query and password_file", map[string]string{
			"RELAY_POSTGRES_DSN": "postgres://relay@db/app?sslmode=disable", "RELAY_POSTGRES_PASSWORD_FILE": pwFile}, hostilePassword, ""},
		{"keyword/value dsn and password_file", map[string]string{
			"RELAY_POSTGRES_DSN": "host=db user=relay dbname=app", "RELAY_POSTGRES_PASSWORD_FILE": pwFile}, hostilePassword, ""},
		{"RELAY_POSTGRES_PASSWORD", map[string]string{postgresRelayPasswordEnv: hostilePassword}, hostilePassword, ""},
		{"password in the dsn", map[string]string{"RELAY_POSTGRES_DSN": "postgres://relay:p%40ss@db/app"}, "p@ss", ""},
		{"dsn password and password_file", map[string]string{
			"RELAY_POSTGRES_DSN": "postgres://relay:other@db/app", "RELAY_POSTGRES_PASSWORD_FILE": pwFile}, "",
			"postgres.dsn: holds a password, and postgres.password_file is set too"},
		{"dsn query password and env", map[string]string{
			"RELAY_POSTGRES_DSN": "postgres://relay@db/app?password=other", postgresRelayPasswordEnv: "x"}, "",
			"postgres.dsn: holds a password, and RELAY_POSTGRES_PASSWORD is set too"},
		{"keyword/value password and password_file", map[string]string{
			"RELAY_POSTGRES_DSN": "host=db password=other", "RELAY_POSTGRES_PASSWORD_FILE": pwFile}, "",
			"postgres.dsn: holds a password, and postgres.password_file is set too"},
		{"password_file and env", map[string]string{"RELAY_POSTGRES_PASSWORD_FILE": pwFile, postgresRelayPasswordEnv: "x"}, "",
			"postgres.password_file: set, and so is RELAY_POSTGRES_PASSWORD"},
		{"password_file missing", map[string]string{"RELAY_POSTGRES_PASSWORD_FILE": pwFile + ".missing"}, "",
			"postgres.password_file: cannot read it: open " + pwFile + ".missing"},
		{"password_file empty", map[string]string{"RELAY_POSTGRES_PASSWORD_FILE": emptyFile}, "",
			"postgres.password_file: " + emptyFile + " is empty"},
		{"sasl password and file", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "plain", "RELAY_KAFKA_SASL_USERNAME": "u",
			"RELAY_KAFKA_SASL_PASSWORD": "x", "RELAY_KAFKA_SASL_PASSWORD_FILE": saslFile}, "",
			"kafka.sasl.password_file: set, and so is kafka.sasl.password"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			passwordlessEnv(t, "postgres://relay@db:5432/app")
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := load(t, "")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("load = %v; want an error containing %q", err, tt.wantErr)
				}
				for _, f := range passwordForms(hostilePassword) {
					if strings.Contains(err.Error(), f) {
						t.Errorf("load error %q contains the password as %q", err, f)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			pc, err := pgconn.ParseConfig(c.Replication.DSN)
			if err != nil {
				t.Fatalf("the effective DSN does not parse: %v", err)
			}
			if pc.Password != tt.wantPG || pc.User != "relay" || pc.Host != "db" || pc.Database != "app" {
				t.Errorf("effective DSN: user %q password %q host %q database %q; want relay, %q, db, app",
					pc.User, pc.Password, pc.Host, pc.Database, tt.wantPG)
			}
			if got := redactDSN(c.Replication.DSN); strings.Contains(got, tt.wantPG) {
				t.Errorf("redactDSN(effective DSN) = %q; contains the password", got)
			}
		})
	}

	t.Run("sasl password_file", func(t *testing.T) {
		cleanEnv(t)
		t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@db:5432/app")
		t.Setenv("RELAY_KAFKA_BROKERS", "k:9092")
		t.Setenv("RELAY_KAFKA_SASL_MECHANISM", "scram-sha-512")
		t.Setenv("RELAY_KAFKA_SASL_USERNAME", "u")
		t.Setenv("RELAY_KAFKA_SASL_PASSWORD_FILE", saslFile)
		c, err := load(t, "")
		if err != nil {
			t.Fatal(err)
		}
		if want := "sasl " + hostilePassword; c.Sink.SASL.Password != want {
			t.Errorf("SASL password = %q; want %q (the file less its \\r\\n)", c.Sink.SASL.Password, want)
		}
	})
}

// TestPostgresPasswordIsNoKey: a password in the config file is refused with
// the way to provide it.
func TestPostgresPasswordIsNoKey(t *testing.T) {
	cleanEnv(t)
	file := writeFile(t, "relay.yaml", "postgres:\n  dsn: postgres://relay@db/app\n  password: "+`"s3cr3t"`+"\nkafka:\n  brokers: [k:9092]\n")
	_, err := load(t, file)
	if err == nil || !strings.Contains(err.Error(), "postgres.password is not a config key") ||
		!strings.Contains(err.Error(), "postgres.password_file") || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("load = %v; want postgres.password refused, postgres.password_file named, no password", err)
	}
}

// TestLoggerWritesWordsAsGiven: the logger no longer rewrites words that look
// like a password (issue 14: the dev password "relay" turned relay.Payment
// into xxxxx.Payment).
func TestLoggerWritesWordsAsGiven(t *testing.T) {
	var buf bytes.Buffer
	log, err := newLogger(&buf, "debug", "text")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("the relay does not", "topic", "relay.Payment", "user", "relay")
	for _, want := range []string{"the relay does not", "topic=relay.Payment", "user=relay"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log line %q lacks %q", buf.String(), want)
		}
	}
}

// TestConfigFileWarning: a config file that holds a secret (a password in
// postgres.dsn, kafka.sasl.password) and that its group or others may read
// gets a warning naming the file, its mode and the fix; one only its owner
// reads, or one without a secret, gets none.
func TestConfigFileWarning(t *testing.T) {
	tests := []struct {
		name, yaml string
		mode       os.FileMode
		want       []string // "" : no warning
	}{
		{"sasl password, world-readable", "kafka:\n  sasl:\n    password: s3cr3t\n", 0o644,
			[]string{"(mode 0644) is readable by its group or others and holds kafka.sasl.password: chmod 600 ", "put kafka.sasl.password in kafka.sasl.password_file or RELAY_KAFKA_SASL_PASSWORD instead"}},
		{"dsn password, group-readable", "postgres:\n  dsn: postgres://relay:s3cr3t@db/app\n", 0o640,
			[]string{"(mode 0640)", "holds postgres.dsn: chmod 600 ", "move the DSN's password to postgres.password_file or RELAY_POSTGRES_PASSWORD"}},
		{"keyword/value dsn password", "postgres:\n  dsn: host=db user=relay password=s3cr3t\n", 0o604, []string{"(mode 0604)", "holds postgres.dsn"}},
		{"both", "postgres:\n  dsn: postgres://relay:s3cr3t@db/app\nkafka:\n  sasl:\n    password: s3cr3t\n", 0o644,
			[]string{"holds kafka.sasl.password and postgres.dsn"}},
		{"owner only", "kafka:\n  sasl:\n    password: s3cr3t\n", 0o600, nil},
		{"no secret", "postgres:\n  dsn: postgres://relay@db/app\n  password_file: /run/secrets/pg\n", 0o644, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "relay.yaml")
			if err := os.WriteFile(file, []byte(tt.yaml), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(file, tt.mode); err != nil { // whatever the umask
				t.Fatal(err)
			}
			got := configFileWarning(file, fileSecrets([]byte(tt.yaml)))
			if tt.want == nil {
				if got != "" {
					t.Fatalf("configFileWarning(%s) = %q; want none", tt.name, got)
				}
				return
			}
			for _, w := range append(tt.want, file+" (mode", "chmod 600 "+file) {
				if !strings.Contains(got, w) {
					t.Errorf("configFileWarning(%s) = %q; want it to hold %q", tt.name, got, w)
				}
			}
			if strings.Contains(got, "s3cr3t") {
				t.Errorf("configFileWarning(%s) = %q; shows the password", tt.name, got)
			}
		})
	}
}

// TestCheckWarnsOnReadableConfigFile runs check with the DSN, password
// included, in a config file: while the file is world-readable check prints
// the warning (and still passes), once it is chmod 600 it does not.
func TestCheckWarnsOnReadableConfigFile(t *testing.T) {
	dsn, _ := dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	if has, err := dsnHasPassword(dsn); err != nil || !has {
		t.Skipf("the test DSN holds no password (%v): nothing to warn about", err)
	}
	unsetenv(t, "RELAY_POSTGRES_DSN")
	file := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(file, []byte("postgres:\n  dsn: '"+dsn+"'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "--config", file, "check")
	if code != exitcode.OK {
		t.Fatalf("check: exit = %d; want 0 (a warning does not fail it)\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	testenv.WantLines(t, "check", out, "warn  config file: "+file+" (mode 0644) is readable by its group or others and holds postgres.dsn: chmod 600 "+file)
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "--config", file, "check")
	if code != exitcode.OK || strings.Contains(out, "config file") {
		t.Fatalf("check of a chmod 600 file: exit = %d, output:\n%s%s\nwant 0 and no warning about the file", code, out, errOut)
	}
}

// TestReplicationDSN: postgres.replication_dsn is checked as postgres.dsn is,
// under its own key, gets the same password, and is used for the replication
// connection only; unset, postgres.dsn serves both.
func TestReplicationDSN(t *testing.T) {
	pwFile := writeFile(t, "pg-password", hostilePassword+"\n")
	setup := func(t *testing.T) { passwordlessEnv(t, "postgres://relay@pgbouncer:6432/app") }
	t.Run("unset", func(t *testing.T) {
		setup(t)
		c, err := load(t, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Replication.ReplicationConnDSN(); got != c.Replication.DSN {
			t.Errorf("ReplicationConnDSN() = %q; want postgres.dsn %q", got, c.Replication.DSN)
		}
	})
	t.Run("password for both", func(t *testing.T) {
		setup(t)
		t.Setenv("RELAY_POSTGRES_REPLICATION_DSN", "host=db port=5432 user=relay dbname=app")
		t.Setenv("RELAY_POSTGRES_PASSWORD_FILE", pwFile)
		c, err := load(t, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []struct{ key, dsn, host string }{
			{"postgres.dsn", c.Replication.DSN, "pgbouncer"},
			{"postgres.replication_dsn", c.Replication.ReplicationConnDSN(), "db"},
		} {
			pc, err := pgconn.ParseConfig(d.dsn)
			if err != nil {
				t.Fatalf("%s: %v", d.key, err)
			}
			if pc.Host != d.host || pc.Password != hostilePassword {
				t.Errorf("%s: host %q password %q; want %q and the file's", d.key, pc.Host, pc.Password, d.host)
			}
		}
	})
	for _, tt := range []struct{ name, dsn, want string }{
		{"unparsable", "postgres://relay:a@b@db/app", "postgres.replication_dsn: `postgres://relay"},
		{"several hosts", "postgres://relay@db1:5432,db2:5432/app", "postgres.replication_dsn names 2 hosts but not target_session_attrs=read-write"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			setup(t)
			t.Setenv("RELAY_POSTGRES_REPLICATION_DSN", tt.dsn)
			if _, err := load(t, ""); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("load with postgres.replication_dsn %q = %v; want an error containing %q", tt.dsn, err, tt.want)
			}
		})
	}
}
