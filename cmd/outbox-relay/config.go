package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/tracing"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// config is the operator's configuration, as typed values: the settings'
// fields (settings.go). Most are fields of the packages' own Configs, held
// in the relay's, which every command's configuration is part of.
type config struct {
	kafkaOptional bool     // the command never talks to Kafka
	ignored       []string // keys set that are accepted and ignored (warned about at start)
	unknownEnv    []string // RELAY_* variables that name no setting and none closely (warned about at start)
	file          string   // the config file, "" when none
	fileSecrets   []string // the secret settings the config file holds itself (fileSecrets)

	// Config is what run builds the relay from (relayConfig adds the
	// loggers): Replication, Router, Sink, Retention, Retry and the relay's
	// own fields. Replication.DSN holds the password when it comes from
	// postgres.password_file or RELAY_POSTGRES_PASSWORD (withPassword), so
	// it must never be printed: redactDSN renders it.
	relay.Config

	PasswordFile     string       // postgres.password_file
	SASLPasswordFile string       // kafka.sasl.password_file
	Layout           sql.Layout   // outbox.layout: the columns' and headers' defaults
	TableLayouts     []sql.Layout // the layout of each of outbox.tables (relay.Config.Tables)
	Format           string       // message.format: plain or cloudevents
	MaxProcs         int          // pipeline.max_procs: GOMAXPROCS unless the variable is set
	Tracing          struct{ OTLPEndpoint, ServiceName string }
	Log              struct{ Level, Format string }
}

// validate fills defaults for empty values and rejects bad ones, naming the
// key and the fix. It returns every problem at once, so that one edit round
// fixes them all. It does not connect anywhere. The packages check their own
// fields (relay.Config.Validate); the checks here are the command line's:
// how the DSN and secrets are given, the layout and format presets, the
// endpoints of metrics and tracing, logging.
func (c *config) validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}

	if dsn := c.Replication.DSN; dsn != "" {
		// checkDSN's errors show the DSN only up to its user name.
		if err := checkDSN(dsn); err != nil {
			errs = append(errs, err)
		} else if err := checkMultiHost(dsn); err != nil {
			errs = append(errs, err)
		} else if err := checkReplicationDSN(c.Replication.ReplicationDSN); err != nil {
			errs = append(errs, err)
		} else if err := c.applyPostgresPassword(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.applySASLPassword(); err != nil {
		errs = append(errs, err)
	}

	errs = append(errs, c.presets()...)

	// Every package's own checks, under the operator's keys.
	for _, fe := range fieldErrors(c.Config.Validate(), &errs) {
		if c.kafkaOptional && fe.Field == "Sink.Brokers" && errors.Is(fe, field.ErrRequired) {
			continue
		}
		errs = append(errs, errors.New(keyText(fe)))
	}

	if c.MetricsListen != "" { // "" disables the metrics endpoint
		if _, port, err := net.SplitHostPort(c.MetricsListen); err != nil || port == "" {
			bad("metrics.listen", "%q is not host:port; write it like 127.0.0.1:9187, or \"\" to disable metrics", c.MetricsListen)
		}
	}
	if e := c.Tracing.OTLPEndpoint; e != "" {
		if _, err := tracing.ParseEndpoint(e); err != nil {
			bad("tracing.otlp_endpoint", "%v; \"\" exports no spans", err)
		}
	}
	if c.MaxProcs < 0 || c.MaxProcs > 1024 {
		bad("pipeline.max_procs", "%d is outside 0 to 1024: 1 (the default) runs the relay on one CPU at a time, 0 on all of them", c.MaxProcs)
	}
	field.Default(&c.Tracing.ServiceName, settingOf("tracing.service_name").def)
	field.Default(&c.Log.Level, settingOf("log.level").def)
	if _, err := parseLevel(c.Log.Level); err != nil {
		bad("log.level", "%v", err)
	}
	field.Default(&c.Log.Format, settingOf("log.format").def)
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", "%q is not text or json", c.Log.Format)
	}
	return errors.Join(errs...)
}

// presets applies the layout (it names the columns and the headers) and the
// format (it turns CloudEvents on) to the router's configuration: the top
// level's, and each of outbox.tables'.
func (c *config) presets() []error {
	var errs []error
	field.Default(&c.Layout, sql.LayoutRelay)
	if cols, err := c.Layout.Columns(); err != nil {
		errs = append(errs, err)
	} else {
		c.Router.Columns = c.Router.Columns.Fill(cols)
	}
	if c.Router.Headers == nil {
		c.Router.Headers = c.Layout.Headers()
	}
	switch c.Format {
	case "", "plain":
		c.Format = "plain"
		// Mode off; a source or content type is then refused by the router.
		c.Router.CloudEvents.Mode = ""
	case "cloudevents":
		field.Default(&c.Router.CloudEvents.Mode, router.CloudEventsBinary)
		if c.Router.CloudEvents.Source == "" {
			// The outbox table names where the events come from until the
			// operator names the service.
			c.Router.CloudEvents.Source = "/outbox-relay/" + c.Table
		}
	default:
		errs = append(errs, fmt.Errorf("message.format: %q: use plain (the payload as the value, the relay's headers) or cloudevents (CloudEvents 1.0 in the Kafka protocol binding; message.cloudevents.mode says binary or structured)", c.Format))
	}
	c.Router.Spans = c.Tracing.OTLPEndpoint != ""
	return errs
}

// fieldErrors returns the *field.Error values in err and appends the other
// errors to others.
func fieldErrors(err error, others *[]error) []*field.Error {
	fes, rest := field.All(err)
	*others = append(*others, rest...)
	return fes
}

// keyText is a package's *field.Error as the operator reads it: the key of
// the field, and the fields it mentions, by their keys. A required key left
// empty says where to set it.
func keyText(fe *field.Error) string {
	key := keyOf(fe.Field)
	if s := settingOf(key); s != nil && s.example != "" && errors.Is(fe, field.ErrRequired) {
		return fmt.Sprintf("%s: empty; set it in the config file or %s=%s", key, envName(key), s.example)
	}
	text := fe.Text(func(f string) string {
		if k := keyOf(f); k != f {
			return k
		}
		return "{" + f + "}"
	})
	if errors.Is(fe, field.ErrRequired) {
		text = strings.Replace(text, "empty: ", "empty; ", 1)
	}
	return key + ": " + text
}

// keyOf is the key of a field of relay.Config ("Sink.BatchBytes"), or the
// field itself when no setting holds it.
func keyOf(f string) string {
	if k, ok := fieldKeys()[f]; ok {
		return k
	}
	if k, ok := tableFieldKey(f); ok {
		return k
	}
	return f
}

// fieldKeys maps each field of relay.Config that a setting holds, by its
// path ("Sink.TLS.CAFile"), to the setting's key: the settings' own field
// functions say which field that is, so no second table can drift.
var fieldKeys = sync.OnceValue(func() map[string]string {
	var c config
	type spot struct {
		addr uintptr
		typ  reflect.Type
	}
	keys := map[spot]string{}
	for _, s := range settings {
		if s.field != nil {
			p := reflect.ValueOf(s.field(&c))
			keys[spot{p.Pointer(), p.Type().Elem()}] = s.key
		}
	}
	paths := map[string]string{}
	var walk func(prefix string, v reflect.Value)
	walk = func(prefix string, v reflect.Value) {
		for i := 0; i < v.NumField(); i++ {
			f, sf := v.Field(i), v.Type().Field(i)
			if !sf.IsExported() {
				continue
			}
			if k, ok := keys[spot{f.Addr().Pointer(), f.Type()}]; ok {
				paths[prefix+sf.Name] = k
			}
			if f.Kind() == reflect.Struct {
				walk(prefix+sf.Name+".", f)
			}
		}
	}
	walk("", reflect.ValueOf(&c.Config).Elem())
	return paths
})

// warnIgnored logs each key that was set but is accepted and ignored.
func (c *config) warnIgnored(log *slog.Logger) {
	for _, key := range c.ignored {
		log.Warn("configuration key accepted for compatibility and ignored: remove it", "key", key, "why", settingOf(key).doc)
	}
	for _, name := range c.unknownEnv {
		log.Warn("environment variable names no setting and is ignored: remove it, or see docs/configuration.md for the variable of each key", "variable", name)
	}
}

func (c *config) routerConfig() router.Config { return c.Router }

func (c *config) sinkConfig(log *slog.Logger) kafkaclient.Config {
	sc := c.Sink
	sc.Logger = log
	return sc
}

// relayConfig is the configuration run builds the relay from.
func (c *config) relayConfig(log *slog.Logger) relay.Config {
	rc := c.Config
	// `outbox-relay status` reads the version of the relay holding the
	// slot from pg_stat_replication.application_name.
	rc.Replication.ApplicationName = "outbox-relay/" + version
	rc.Replication.Logger = log.With("component", "replication")
	rc.Sink.Logger = log.With("component", "sink")
	rc.OtherTablesKey = "outbox.other_tables"
	rc.Logger = log
	return rc
}

// retentionConfig is the retention the relay runs and prune runs once; its
// Retention is 0 when off.
func (c *config) retentionConfig() retention.Config {
	rc := c.Retention
	rc.Table, rc.CheckpointTable, rc.Slot = c.Table, c.CheckpointTable, c.Replication.Slot
	if rt, err := sql.ParseTable(c.RetryTable); err == nil {
		rc.BufferTable = sql.WALBufferTable(rt).String()
	}
	return rc
}
