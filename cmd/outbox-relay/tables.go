package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/router"
)

// outbox.tables lists more outbox tables, read on the relay's slot: each an
// object with its table and the settings of its own that it changes. An
// entry takes topics.* and message.* from the top level unless it sets them;
// its columns and its relay headers (message.headers) follow its own layout
// (outbox.layout's value by default), never the top level's columns, which
// name another table's.

// tableKeys reports whether a key an entry may set (relative to the entry,
// as "columns.id") is one, and the setting's key.
func tableKey(k string) (*setting, bool) {
	global := k
	if k == "layout" || strings.HasPrefix(k, "columns.") {
		global = "outbox." + k
	}
	s := settingOf(global)
	if s == nil || s.kind == ignored {
		return nil, false
	}
	if global == "outbox.layout" || strings.HasPrefix(global, "outbox.columns.") ||
		strings.HasPrefix(global, "topics.") || strings.HasPrefix(global, "message.") {
		return s, true
	}
	return nil, false
}

// tablesEntries reads outbox.tables from a YAML value (the file's, or the
// environment's RELAY_OUTBOX_TABLES as YAML or JSON text).
func tablesEntries(val any) ([]map[string]any, error) {
	if val == nil {
		return nil, nil
	}
	list, ok := val.([]any)
	if !ok {
		return nil, errors.New("outbox.tables: want a list of tables, each {table: schema.name, ...}")
	}
	var out []map[string]any
	for i, v := range list {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("outbox.tables[%d]: want an object {table: schema.name, ...}, got %v", i, v)
		}
		out = append(out, m)
	}
	return out, nil
}

// tablesFromEnv parses RELAY_OUTBOX_TABLES, if set.
func tablesFromEnv() ([]map[string]any, bool, error) {
	env, ok := os.LookupEnv(envName("outbox.tables"))
	if !ok || strings.TrimSpace(env) == "" {
		return nil, false, nil
	}
	var val any
	if err := yaml.Unmarshal([]byte(env), &val); err != nil {
		return nil, true, fmt.Errorf("%s: %w; write it as YAML or JSON, e.g. [{table: public.billing_outbox, layout: debezium}]", envName("outbox.tables"), err)
	}
	es, err := tablesEntries(val)
	return es, true, err
}

// readTables turns the entries into c.Tables, each from a copy of c (read,
// not yet validated) with the entry's settings applied and the presets of
// its layout and format.
func readTables(entries []map[string]any, c *config) error {
	var errs []error
	for i, entry := range entries {
		where := fmt.Sprintf("outbox.tables[%d]", i)
		table, _ := entry["table"].(string)
		if strings.TrimSpace(table) == "" {
			errs = append(errs, fmt.Errorf("%s.table: empty; name the outbox table (table or schema.table)", where))
			continue
		}
		ec := *c
		ec.Table = strings.TrimSpace(table)
		ec.Router.Columns = router.Columns{}
		ec.Router.Headers = nil
		v := viper.New()
		maps := map[string]map[string]string{}
		var set []*setting
		var walk func(prefix string, m map[string]any) error
		walk = func(prefix string, m map[string]any) error {
			for _, k := range sortedKeys(m) {
				key, val := prefix+k, m[k]
				if key == "table" {
					continue
				}
				s, ok := tableKey(key)
				if !ok {
					if sub, isMap := val.(map[string]any); isMap {
						if err := walk(key+".", sub); err != nil {
							return err
						}
						continue
					}
					return fmt.Errorf("%s.%s: not a setting of an outbox table (table, layout, columns.*, topics.*, message.*)", where, key)
				}
				if s.isMap() {
					om, ok := val.(map[string]any)
					if !ok && val != nil {
						return fmt.Errorf("%s.%s: want a map of %s", where, key, s.entry)
					}
					entries := map[string]string{}
					for name, x := range om {
						entries[name] = fmt.Sprint(x)
					}
					maps[s.key] = entries
				} else {
					if items, isList := val.([]any); isList && s.kind != list {
						// message.headers or message.fields written as a
						// YAML list: the comma-separated form.
						parts := make([]string, len(items))
						for i, x := range items {
							parts[i] = fmt.Sprint(x)
						}
						val = strings.Join(parts, ",")
					}
					v.Set(s.key, val)
				}
				set = append(set, s)
			}
			return nil
		}
		if err := walk("", entry); err != nil {
			errs = append(errs, err)
			continue
		}
		l := loader{v: v, maps: maps}
		for _, s := range set {
			l.read(s, &ec)
		}
		for _, err := range l.errs {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		for _, err := range ec.presets() {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		c.Tables = append(c.Tables, relay.OutboxTable{Table: ec.Table, Router: ec.Router})
		c.TableLayouts = append(c.TableLayouts, ec.Layout)
	}
	return errors.Join(errs...)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// tableFieldKey is the key of a field of a table of outbox.tables
// ("Tables[1].Router.Topic"): "outbox.tables[1].topics.template".
func tableFieldKey(f string) (string, bool) {
	rest, ok := strings.CutPrefix(f, "Tables[")
	if !ok {
		return "", false
	}
	i, sub, ok := strings.Cut(rest, "].")
	if !ok {
		return "", false
	}
	if sub == "Table" {
		return "outbox.tables[" + i + "].table", true
	}
	if k, ok := fieldKeys()[sub]; ok {
		k = strings.TrimPrefix(k, "outbox.")
		return "outbox.tables[" + i + "]." + k, true
	}
	return "", false
}

// moreTables names the tables of outbox.tables.
func (c *config) moreTables() []string {
	var out []string
	for _, t := range c.Tables {
		out = append(out, t.Table)
	}
	return out
}
