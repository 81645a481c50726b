package testenv

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv/certs"
)

// The secure endpoints of the dev servers (scripts/dev.sh up, issue 14), exported by
// `make -s dev-env` beside the plain ones.
const (
	envPostgresTLSDSN  = "RELAY_TEST_POSTGRES_TLS_DSN"    // keyword DSN: relay_cert, verify-full, client certificate
	envKafkaSASL       = "RELAY_TEST_KAFKA_SASL_BROKERS"  // SASL_SSL, SCRAM-SHA-512
	envKafkaMTLS       = "RELAY_TEST_KAFKA_MTLS_BROKERS"  // SSL with client certificates required
	envKafkaOAuth      = "RELAY_TEST_KAFKA_OAUTH_BROKERS" // SASL_SSL, OAUTHBEARER with unsecured JWTs
	envKafkaSASLUser   = "RELAY_TEST_KAFKA_SASL_USER"
	envKafkaSASLPass   = "RELAY_TEST_KAFKA_SASL_PASSWORD"
	envKafkaPrefix     = "RELAY_TEST_KAFKA_TOPIC_PREFIX" // the topics the SASL user may write
	envTLSDir          = "RELAY_TEST_TLS_DIR"
	howToStartSecure   = "start the dev servers with the current scripts/dev.sh (`make dev-up`, which also reconfigures servers started by an older one) and export them with `eval \"$(make -s dev-env)\"`, or run `make test`"
	containersInsecure = "the TLS, SASL and ACL endpoints exist only on the dev servers of scripts/dev.sh, not on the Docker containers testenv starts"
)

// TLSFiles are the dev servers' TLS files (package certs), as absolute paths.
type TLSFiles struct {
	Dir string
	CA  string // the dev CA: signs the servers' and the clients' certificates
	// OtherCA signed nothing the servers use: a client trusting it only must
	// refuse the servers ("wrong CA").
	OtherCA                         string
	PGClientCert, PGClientKey       string // CN=relay_cert: Postgres cert authentication
	KafkaClientCert, KafkaClientKey string // CN=relay (User:relay): the mTLS listener
	// A client certificate with CN=relay signed by OtherCA: the mTLS listener must
	// refuse it.
	OtherClientCert, OtherClientKey string
}

// PGTLS is a test's own database (see Postgres) reachable over TLS as well.
type PGTLS struct {
	*PG // plain connection as the admin role: create tables, grant, inspect
	// TLSDSN reaches the same database as PGUser with sslmode=verify-full, the
	// dev CA and the client certificate (pg_hba.conf: hostssl ... cert), for
	// the normal and the replication connection alike.
	TLSDSN string
	PGUser string // certs.PGClientUser, a member of the admin role
	Files  TLSFiles
}

// PostgresTLS returns a fresh database (as Postgres does) with its TLS DSN. It skips
// under -short without servers, and when the servers are testenv's Docker containers
// (which have no TLS); with dev servers that lack the TLS setup it fails, naming
// `make dev-up`.
func PostgresTLS(t testing.TB) *PGTLS {
	t.Helper()
	requireSecure(t, envPostgresDSN, envPostgresTLSDSN, envTLSDir)
	p := Postgres(t)
	files := tlsFiles(t)
	dsn := os.Getenv(envPostgresTLSDSN)
	cfg, err := pgx.ParseConfig(p.DSN)
	if err != nil {
		t.Fatalf("testenv: PostgresTLS: %v", err)
	}
	return &PGTLS{PG: p, TLSDSN: withDatabase(dsn, cfg.Database), PGUser: certs.PGClientUser, Files: files}
}

// KafkaSecureCluster is the dev broker's secure listeners, beside the plain one.
type KafkaSecureCluster struct {
	// The PLAINTEXT listener, whose ANONYMOUS principal may do anything: create
	// topics and read what the relay wrote with it.
	*KafkaCluster
	SASLBrokers    []string // SASL_SSL: SCRAM-SHA-512 as User, TLS with Files.CA
	MTLSBrokers    []string // SSL: a client certificate is required; CN=relay is User:relay
	User, Password string   // SCRAM-SHA-512 credentials of the relay's principal
	// TopicPrefix is what User (and the mTLS client) may WRITE and DESCRIBE
	// ("outbox.event."); any other topic is refused with
	// TOPIC_AUTHORIZATION_FAILED. It may also DESCRIBE the cluster.
	TopicPrefix string
	Files       TLSFiles
}

// KafkaSecure returns the secure listeners after checking that the plain one
// answers (see Kafka). It skips and fails as PostgresTLS does.
func KafkaSecure(t testing.TB) *KafkaSecureCluster {
	t.Helper()
	requireSecure(t, envKafkaBrokers, envKafkaSASL, envKafkaMTLS, envKafkaSASLUser, envKafkaSASLPass, envKafkaPrefix, envTLSDir)
	k := Kafka(t)
	return &KafkaSecureCluster{
		KafkaCluster: k,
		SASLBrokers:  splitList(os.Getenv(envKafkaSASL)),
		MTLSBrokers:  splitList(os.Getenv(envKafkaMTLS)),
		User:         os.Getenv(envKafkaSASLUser),
		Password:     os.Getenv(envKafkaSASLPass),
		TopicPrefix:  os.Getenv(envKafkaPrefix),
		Files:        tlsFiles(t),
	}
}

// KafkaOAuthCluster is the dev broker's OAUTHBEARER listener (SASL_SSL): Kafka's
// unsecured validator, which takes an unsigned JWT (UnsecuredJWT) whose exp has not
// passed and makes its sub the principal.
type KafkaOAuthCluster struct {
	*KafkaCluster          // the PLAINTEXT listener, as in KafkaSecureCluster
	OAuthBrokers  []string // SASL_SSL with OAUTHBEARER, TLS with Files.CA
	User          string   // the relay's principal: a token with this sub has its ACLs
	SuperUser     string   // a super user of the dev broker: may read any topic
	TopicPrefix   string   // what User may WRITE and DESCRIBE (see KafkaSecureCluster)
	Files         TLSFiles
}

// devKafkaSuperUser is scripts/dev.sh's KAFKA_ADMIN_USER, in the broker's super.users.
const devKafkaSuperUser = "admin"

// KafkaOAuth returns the OAUTHBEARER listener after checking that the plain one
// answers (see Kafka). It skips and fails as KafkaSecure does.
func KafkaOAuth(t testing.TB) *KafkaOAuthCluster {
	t.Helper()
	requireSecure(t, envKafkaBrokers, envKafkaOAuth, envKafkaSASLUser, envKafkaPrefix, envTLSDir)
	k := Kafka(t)
	return &KafkaOAuthCluster{
		KafkaCluster: k,
		OAuthBrokers: splitList(os.Getenv(envKafkaOAuth)),
		User:         os.Getenv(envKafkaSASLUser),
		SuperUser:    devKafkaSuperUser,
		TopicPrefix:  os.Getenv(envKafkaPrefix),
		Files:        tlsFiles(t),
	}
}

// UnsecuredJWT is a token the dev broker's OAUTHBEARER listener accepts for sub
// until exp: an unsigned JWT ("alg": "none", RFC 7519 section 6) with iat and exp.
// Anyone can make one: dev brokers only.
func UnsecuredJWT(sub string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	header := enc([]byte(`{"alg":"none"}`))
	claims, _ := json.Marshal(map[string]any{"sub": sub, "iat": time.Now().Unix(), "exp": exp.Unix()})
	return header + "." + enc(claims) + "."
}

// requireSecure skips or fails t unless every variable of secure is set. plain is
// the variable of the plain server the secure one belongs to: without it, under
// -short the test skips (Postgres or Kafka would), and with Docker it skips since
// containers have no secure endpoints.
func requireSecure(t testing.TB, plain string, secure ...string) {
	t.Helper()
	var missing []string
	for _, env := range secure {
		if os.Getenv(env) == "" {
			missing = append(missing, env)
		}
	}
	if len(missing) == 0 {
		return
	}
	skipUnlessServers(t, append([]string{plain}, secure...)...)
	if os.Getenv(plain) == "" && dockerAvailable() {
		t.Skipf("testenv: skipped: %s; %s", containersInsecure, howToStartSecure)
	}
	t.Fatalf("testenv: %s not set: the dev servers were started without TLS, SASL and ACLs, or their environment was not exported; %s",
		strings.Join(missing, ", "), howToStartSecure)
}

func tlsFiles(t testing.TB) TLSFiles {
	t.Helper()
	dir := os.Getenv(envTLSDir)
	p := func(name string) string { return filepath.Join(dir, name) }
	f := TLSFiles{
		Dir: dir, CA: p(certs.CA), OtherCA: p(certs.OtherCA),
		PGClientCert: p(certs.PGClientCert), PGClientKey: p(certs.PGClientKey),
		KafkaClientCert: p(certs.KafkaClient), KafkaClientKey: p(certs.KafkaKey),
		OtherClientCert: p(certs.OtherClient), OtherClientKey: p(certs.OtherKey),
	}
	for _, path := range []string{f.CA, f.OtherCA, f.PGClientCert, f.PGClientKey, f.KafkaClientCert, f.KafkaClientKey, f.OtherClientCert, f.OtherClientKey} {
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("testenv: %s: %v; %s", envTLSDir, err, howToStartSecure)
		}
	}
	return f
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
