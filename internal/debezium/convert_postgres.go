package debezium

import (
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// postgres maps the connection, the slot and the publication.
func (c *converter) postgres() {
	c.dsn()
	slot := c.slot()
	pub := c.publication()
	if ms, has := c.get("status.update.interval.ms"); has && ms != "" {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 && time.Duration(n)*time.Millisecond != 10*time.Second {
			c.set("postgres.status_interval", (time.Duration(n) * time.Millisecond).String(), "status.update.interval.ms")
		}
	}
	c.plugin(slot)
	c.publicationMode(pub)
}

// dsn maps the connection settings to postgres.dsn, which it sets only
// when host, user and database are all there and literal.
func (c *converter) dsn() {
	host, hasHost := c.get("database.hostname")
	port, hasPort := c.get("database.port")
	user, hasUser := c.get("database.user")
	db, hasDB := c.get("database.dbname")
	if !hasPort || port == "" {
		port = defaultPort
	}
	ok := true
	for _, m := range []struct {
		key, value string
		has        bool
	}{{"database.hostname", host, hasHost}, {"database.user", user, hasUser}, {"database.dbname", db, hasDB}} {
		if !m.has || m.value == "" {
			c.gap(m.key, "", "not set, so postgres.dsn cannot be built: set postgres.dsn (or RELAY_POSTGRES_DSN) to postgres://user@host:port/database")
			ok = false
		} else if !c.literal(m.key, m.value, "postgres.dsn") {
			ok = false
		}
	}
	if ok && !c.literal("database.port", port, "postgres.dsn") {
		ok = false
	}
	from := []string{"database.hostname"}
	if hasPort {
		from = append(from, "database.port")
	}
	from = append(from, "database.user", "database.dbname")
	q, from := c.dsnTLS(from)
	if _, has := c.get("database.password"); has {
		c.note("database.password", redacted, "passwords are never copied into the relay's configuration: put it in a file named by postgres.password_file (RELAY_POSTGRES_PASSWORD_FILE), or in RELAY_POSTGRES_PASSWORD, or a .pgpass file")
	}
	if _, has := c.get("database.sslpassword"); has {
		c.note("database.sslpassword", redacted, "the key's password is never copied: add sslpassword=... to the DSN in RELAY_POSTGRES_DSN")
	}
	if v, has := c.get("database.sslfactory"); has {
		c.gap("database.sslfactory", v, "a pgjdbc SSL socket factory has no equivalent: configure TLS with sslmode, sslrootcert, sslcert and sslkey in postgres.dsn")
	}
	if ok {
		u := url.URL{Scheme: "postgres", User: url.User(user), Host: net.JoinHostPort(host, port), Path: "/" + db, RawQuery: q.Encode()}
		c.set("postgres.dsn", u.String(), strings.Join(from, ", "))
	}
}

// dsnTLS maps sslmode and the certificate files to the DSN's query,
// appending the keys it used to from.
func (c *converter) dsnTLS(from []string) (url.Values, []string) {
	q := url.Values{}
	if mode, has := c.get("database.sslmode"); has && mode != "" {
		from = append(from, "database.sslmode")
		switch m := strings.ToLower(mode); m {
		case "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
			q.Set("sslmode", m)
		case "disabled", "required":
			// Spellings of older Debezium versions.
			q.Set("sslmode", strings.TrimSuffix(m, "d"))
		default:
			c.gap("database.sslmode", mode, "not a Postgres sslmode: set sslmode in postgres.dsn to disable, allow, prefer, require, verify-ca or verify-full")
		}
	}
	for _, f := range []struct{ key, param, why string }{
		{"database.sslrootcert", "sslrootcert", "the relay must be able to read this file (PEM)"},
		{"database.sslcert", "sslcert", "the relay must be able to read this file (PEM)"},
		{"database.sslkey", "sslkey", "pgjdbc reads a DER (PKCS-8, .pk8) key; the relay needs a PEM key: convert it (openssl pkcs8 -inform DER -in key.pk8 -out key.pem) and change sslkey in postgres.dsn"},
	} {
		if v, has := c.get(f.key); has && v != "" && c.literal(f.key, v, "postgres.dsn") {
			q.Set(f.param, v)
			from = append(from, f.key)
			c.note(f.key, v, "copied into postgres.dsn as %s: %s", f.param, f.why)
		}
	}
	return q, from
}

// slot maps slot.name (Debezium's default if unset) and returns it.
func (c *converter) slot() string {
	slot, has := c.get("slot.name")
	if !has || slot == "" {
		slot = defaultSlot
	}
	if c.literal("slot.name", slot, "postgres.slot") {
		c.set("postgres.slot", slot, "slot.name")
	}
	return slot
}

// publication maps publication.name (Debezium's default if unset) and returns it.
func (c *converter) publication() string {
	pub, has := c.get("publication.name")
	if !has || pub == "" {
		pub = defaultPublication
	}
	if c.literal("publication.name", pub, "postgres.publication") {
		c.set("postgres.publication", pub, "publication.name")
	}
	return pub
}

// plugin reports a slot that does not decode with pgoutput, the only
// plugin the relay reads.
func (c *converter) plugin(slot string) {
	plugin, has := c.get("plugin.name")
	switch p := strings.ToLower(plugin); {
	case p == "pgoutput":
	case !has || p == "":
		c.gap("plugin.name", "", "not set, so Debezium used decoderbufs, its default, and its slot %q decodes with decoderbufs; the relay reads pgoutput only: create a new pgoutput slot (outbox-relay setup) while Debezium still runs, start the relay on it, then stop Debezium; the overlap is sent twice, nothing is lost. Debezium's offsets do not apply to the new slot", slot)
	default:
		c.gap("plugin.name", plugin, "the slot %q decodes with %s; the relay reads pgoutput only: create a new pgoutput slot (outbox-relay setup) while Debezium still runs, start the relay on it, then stop Debezium; the overlap is sent twice, nothing is lost. Debezium's offsets do not apply to the new slot", slot, plugin)
	}
}

// publicationMode notes what Debezium's publication.autocreate.mode made
// of publication pub and how the relay reads it.
func (c *converter) publicationMode(pub string) {
	mode, has := c.get("publication.autocreate.mode")
	if !has || mode == "" {
		mode = "all_tables"
	}
	switch strings.ToLower(mode) {
	case "all_tables":
		c.note("publication.autocreate.mode", mode, "Debezium creates publication %q FOR ALL TABLES (its default): the relay works with it, ignoring other tables' rows, but Postgres then decodes and sends every table's changes; a publication of the outbox table alone, inserts only (as outbox-relay setup creates), is lighter", pub)
	case "filtered":
		c.note("publication.autocreate.mode", mode, "Debezium creates publication %q for the included tables and every operation: the relay works with it and ignores updates and deletes; one publishing inserts only (as outbox-relay setup creates) is lighter", pub)
	default:
		c.note("publication.autocreate.mode", mode, "the publication %q is managed outside Debezium; the relay uses it as it is", pub)
	}
}

// tableName matches an include-list entry that names one table: table or
// schema.table, dots possibly escaped as in a regex.
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\\?\.[A-Za-z_][A-Za-z0-9_$]*)?$`)

func (c *converter) table() {
	key := "table.include.list"
	list, has := c.get(key)
	if old, hasOld := c.get("table.whitelist"); !has && hasOld {
		key, list, has = "table.whitelist", old, true
	}
	var entries []string
	for e := range strings.SplitSeq(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			entries = append(entries, e)
		}
	}
	switch {
	case !has || len(entries) == 0:
		c.gap("table.include.list", "", "not set, so Debezium captured every table of the publication; the relay reads one outbox table: set outbox.table to it (schema.table)")
	case len(entries) > 1:
		c.gap(key, list, "lists %d tables; the relay reads one outbox table: set outbox.table to it, and run one relay per outbox table", len(entries))
	case !tableName.MatchString(entries[0]):
		c.gap(key, list, "is a regular expression, not one table's name; the relay reads one table named exactly: set outbox.table to it (schema.table)")
	default:
		name := strings.ReplaceAll(entries[0], `\.`, ".")
		c.set("outbox.table", name, key)
		if strings.ToLower(name) != name {
			c.note(key, list, "Debezium matches table names ignoring case, outbox.table is exact: check that %q is the table's name as Postgres stores it", name)
		}
	}
}
