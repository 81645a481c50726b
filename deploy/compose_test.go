package deploy

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// composeFile is the part of docker-compose.yml the test reads.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Healthcheck *struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

// TestComposeLeastPrivilege: docker-compose.yml's relays log in as the
// least-privilege role that sql/006_grants.sql creates (LOGIN REPLICATION,
// never superuser; docs/security.md), not as the image's superuser, and the
// init script gives that role its password; every long-running service has a
// healthcheck, the relays' asking their own /readyz on the metrics port
// (issue 37). When docker-compose is installed, it must accept the file.
func TestComposeLeastPrivilege(t *testing.T) {
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	pg, ok := c.Services["postgres"]
	if !ok {
		t.Fatal("docker-compose.yml has no postgres service")
	}
	superuser := pg.Environment["POSTGRES_USER"]
	grants, err := os.ReadFile("../sql/006_grants.sql")
	if err != nil {
		t.Fatal(err)
	}
	const role = "outbox_relay"
	if !strings.Contains(string(grants), `CREATE ROLE "`+role+`" LOGIN REPLICATION;`) || regexp.MustCompile(`(?m)^\s*[^-\s].*\bSUPERUSER\b`).Match(grants) {
		t.Fatalf("sql/006_grants.sql no longer creates %s LOGIN REPLICATION without superuser: fix this test or the compose file", role)
	}

	relays := 0
	for name, s := range c.Services {
		if s.Healthcheck == nil && name != "relay-setup" { // a one-shot has nothing to report
			t.Errorf("service %s has no healthcheck", name)
		}
		if s.Image != "outbox-relay:local" || len(s.Command) == 0 || s.Command[0] != "run" {
			continue
		}
		relays++
		u, err := url.Parse(s.Environment["RELAY_POSTGRES_DSN"])
		if err != nil {
			t.Errorf("service %s: RELAY_POSTGRES_DSN: %v", name, err)
			continue
		}
		if user := u.User.Username(); user != role || user == superuser {
			t.Errorf("service %s logs in as %q; want %q (the role of sql/006_grants.sql), never the superuser %q", name, user, role, superuser)
		}
		_, port, _ := strings.Cut(s.Environment["RELAY_METRICS_LISTEN"], ":")
		var test string
		if s.Healthcheck != nil {
			test = strings.Join(s.Healthcheck.Test, " ")
		}
		if want := "outbox-relay health --url http://127.0.0.1:" + port + "/readyz"; port == "" || !strings.Contains(test, want) {
			t.Errorf("service %s healthcheck = %q; want it to run %q (RELAY_METRICS_LISTEN %q)", name, test, want, s.Environment["RELAY_METRICS_LISTEN"])
		}
	}
	if relays != 2 {
		t.Errorf("docker-compose.yml runs %d relays; want 2 (relay, relay-2)", relays)
	}
	if pg.Healthcheck == nil || !strings.Contains(strings.Join(pg.Healthcheck.Test, " "), "pg_isready -h 127.0.0.1") {
		t.Errorf("postgres healthcheck = %+v; want pg_isready -h 127.0.0.1, over TCP (the init scripts' server listens on its socket only)", pg.Healthcheck)
	}

	// The init script runs every sql/*.sql and sets the role's password.
	mounts := strings.Join(pg.Volumes, "\n")
	for _, want := range []string{"./sql:/outbox-relay-sql:ro", "./deploy/compose/initdb.sh:/docker-entrypoint-initdb.d/"} {
		if !strings.Contains(mounts, want) {
			t.Errorf("postgres volumes lack %q:\n%s", want, mounts)
		}
	}
	script, err := os.ReadFile("compose/initdb.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`for f in /outbox-relay-sql/\*\.sql`).Match(script) ||
		!strings.Contains(string(script), "ALTER ROLE "+role+" LOGIN PASSWORD '$RELAY_ROLE_PASSWORD'") {
		t.Errorf("deploy/compose/initdb.sh does not run sql/*.sql and set %s's password:\n%s", role, script)
	}
	if pg.Environment["RELAY_ROLE_PASSWORD"] == "" {
		t.Errorf("postgres service sets no RELAY_ROLE_PASSWORD for initdb.sh")
	}
	if fi, err := os.Stat("compose/initdb.sh"); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("deploy/compose/initdb.sh is not executable (the entrypoint would source it): %v", err)
	}

	if dc, err := exec.LookPath("docker-compose"); err == nil {
		cmd := exec.Command(dc, "-f", filepath.Join("..", "docker-compose.yml"), "config", "-q")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("docker-compose config -q: %v\n%s", err, out)
		}
	}
}
