package main

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/router"
)

// loadConfig reads the config file (if any), the RELAY_* environment and the
// flags of settings, in increasing precedence, and validates the result.
// Nothing here connects anywhere.
func loadConfig(file string, flags *pflag.FlagSet) (*config, error) {
	return loadConfigFor(file, flags, true)
}

// loadConfigFor is loadConfig for a command that may not talk to Kafka at all
// (lag, status, retries list): then kafka.brokers may be left empty.
func loadConfigFor(file string, flags *pflag.FlagSet, needKafka bool) (*config, error) {
	v := viper.New()
	v.SetEnvPrefix("RELAY")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	// An empty RELAY_METRICS_LISTEN must be able to disable metrics.
	v.AllowEmptyEnv(true)
	for _, s := range settings {
		if s.isMap() || s.kind == tables {
			continue
		}
		// An ignored key has no default, so that IsSet tells whether the
		// operator set it.
		if s.kind != ignored {
			v.SetDefault(s.key, s.def)
		}
		if err := v.BindEnv(s.key); err != nil {
			return nil, err
		}
		if f := flags.Lookup(s.flag); s.flag != "" && f != nil {
			if err := v.BindPFlag(s.key, f); err != nil {
				return nil, err
			}
		}
	}

	maps := map[string]map[string]string{}
	var outboxTables []map[string]any
	var secrets []string // those the file holds itself, for check
	if file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		// viper folds keys to lower case, which would corrupt the
		// aggregate types in topics.overrides and hide typos of upper-case
		// keys: the file is walked here for both.
		if maps, outboxTables, err = checkKeys(raw); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
		v.SetConfigFile(file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
		secrets = fileSecrets(raw)
	}
	for _, s := range settings {
		if env, ok := os.LookupEnv(envName(s.key)); ok && s.isMap() {
			m, err := parseMapEnv(&s, env)
			if err != nil {
				return nil, err
			}
			maps[s.key] = m
		}
	}

	if es, ok, err := tablesFromEnv(); err != nil {
		return nil, err
	} else if ok {
		outboxTables = es
	}

	unknownEnv, err := checkEnv(os.Environ())
	if err != nil {
		return nil, err
	}

	l := loader{v: v, maps: maps}
	c := &config{unknownEnv: unknownEnv, file: file, fileSecrets: secrets}
	for i := range settings {
		l.read(&settings[i], c)
	}
	if err := errors.Join(l.errs...); err != nil {
		return c, err
	}
	// Each table of outbox.tables starts from the top level as read.
	if err := readTables(outboxTables, c); err != nil {
		return c, err
	}
	c.kafkaOptional = !needKafka
	return c, c.validate()
}

// loader converts viper's values, collecting an error per bad key (viper's
// own getters turn "ten seconds" into 0 silently).
type loader struct {
	v    *viper.Viper
	maps map[string]map[string]string
	errs []error
}

// read sets the setting's field of c from its value.
func (l *loader) read(s *setting, c *config) {
	key := s.key
	if s.kind == ignored {
		if l.v.IsSet(key) {
			c.ignored = append(c.ignored, key)
		}
		return
	}
	if s.kind == tables {
		return // readTables, once every other key is read
	}
	p := s.field(c)
	switch s.kind {
	case text:
		reflect.ValueOf(p).Elem().SetString(l.str(key))
	case lower:
		reflect.ValueOf(p).Elem().SetString(strings.ToLower(l.str(key)))
	case secret:
		*p.(*string) = l.v.GetString(key)
	case duration:
		*p.(*time.Duration) = l.duration(key)
	case off:
		if !strings.EqualFold(l.str(key), "off") {
			*p.(*time.Duration) = l.duration(key)
		}
	case integer:
		reflect.ValueOf(p).Elem().SetInt(int64(l.int(key)))
	case size:
		*p.(*int64) = l.size(key)
	case boolean:
		*p.(*bool) = l.bool(key)
	case negated:
		*p.(*bool) = !l.bool(key)
	case list:
		*p.(*[]string) = l.list(key)
	case headers:
		// nil takes the layout's headers (validate); "-" is none.
		if h := l.str(key); h == "-" {
			*p.(*[]string) = []string{}
		} else if h != "" {
			*p.(*[]string) = l.list(key)
		}
	case fields:
		if f := l.str(key); f != "" {
			fs, err := router.ParseFields(f)
			if err != nil {
				l.errs = append(l.errs, keyError(key, err))
			}
			*p.(*[]router.Field) = fs
		}
	case mapping:
		*p.(*map[string]string) = l.maps[key]
	case placements:
		for table, action := range l.maps[key] {
			a, err := placement.ParseAction(action)
			if err != nil {
				l.errs = append(l.errs, fmt.Errorf("%s.%s: %w", key, table, err))
				continue
			}
			m := p.(*map[string]placement.Action)
			if *m == nil {
				*m = map[string]placement.Action{}
			}
			(*m)[table] = a
		}
	default:
		panic("setting " + key + ": no reader for its kind")
	}
}

// keyError is err, from parsing key's value, under the key: a *field.Error
// names the package's field, which is this key's.
func keyError(key string, err error) error {
	var fe *field.Error
	if errors.As(err, &fe) {
		return fmt.Errorf("%s: %s", key, fe.Text(nil))
	}
	return fmt.Errorf("%s: %w", key, err)
}

func (l *loader) str(key string) string { return strings.TrimSpace(l.v.GetString(key)) }

func (l *loader) duration(key string) time.Duration {
	s := l.str(key)
	if s == "" {
		return 0
	}
	d, err := parseDuration(s)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%s: %w", key, err))
	}
	return d
}

func (l *loader) int(key string) int {
	s := l.str(key)
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	switch {
	case errors.Is(err, strconv.ErrRange):
		l.errs = append(l.errs, fmt.Errorf("%s: %s is out of range for a whole number; use a smaller value such as %s", key, s, settingOf(key).def))
	case err != nil:
		l.errs = append(l.errs, fmt.Errorf("%s: %q is not a whole number", key, s))
	}
	return n
}

// size reads a number of bytes as Postgres writes them (1GB, 64MB, 512kB:
// units of 1024, case-insensitive), a plain number, or off.
func (l *loader) size(key string) int64 {
	s := strings.TrimSpace(l.str(key))
	if s == "" || strings.EqualFold(s, "off") {
		return 0
	}
	n, err := parseSize(s)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%s: %q is not a size; write it as 1GB, 512MB, 64kB, a number of bytes, or off", key, s))
	}
	return n
}

func parseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"tb", 1 << 40}, {"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10}, {"b", 1}}
	num, mult := strings.ToLower(s), int64(1)
	for _, u := range units {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q", s)
	}
	return n * mult, nil
}

func (l *loader) bool(key string) bool {
	s := l.str(key)
	if s == "" {
		return false
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%s: %q is not true or false", key, s))
	}
	return b
}

// list accepts a YAML list or a comma-separated string (env and flags).
func (l *loader) list(key string) []string {
	var items []string
	switch v := l.v.Get(key).(type) {
	case []any:
		for _, x := range v {
			items = append(items, fmt.Sprint(x))
		}
	case []string:
		items = v
	default:
		items = strings.Split(l.str(key), ",")
	}
	var out []string
	for _, s := range items {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// parseMapEnv parses a map key's environment variable, as
// RELAY_TOPICS_OVERRIDES="Order=orders,Payment=payments".
func parseMapEnv(s *setting, env string) (map[string]string, error) {
	m := map[string]string{}
	for _, pair := range strings.Split(env, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s: %q is not %s; write it like %s",
				envName(s.key), pair, strings.Replace(s.entry, ": ", "=", 1), s.example)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

// checkKeys rejects keys of the YAML document that are not config keys (typos
// would otherwise be ignored silently) and returns the map keys' values with
// their keys' case intact.
func checkKeys(raw []byte) (map[string]map[string]string, []map[string]any, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, nil, err
	}
	maps := map[string]map[string]string{}
	var outboxTables []map[string]any
	var walk func(prefix string, m map[string]any) error
	walk = func(prefix string, m map[string]any) error {
		for k, val := range m {
			key := prefix + k
			if s := settingOf(key); s != nil && s.kind == tables {
				es, err := tablesEntries(val)
				if err != nil {
					return err
				}
				outboxTables = es
				continue
			}
			if s := settingOf(key); s != nil && s.isMap() {
				if val == nil {
					continue
				}
				om, ok := val.(map[string]any)
				if !ok {
					return fmt.Errorf("%s: want a map of %s", key, s.entry)
				}
				entries := make(map[string]string, len(om))
				for name, v := range om {
					str, ok := v.(string)
					if !ok {
						return fmt.Errorf("%s.%s: want a string (%s), got %v", key, name, s.entry, v)
					}
					entries[name] = str
				}
				maps[key] = entries
				continue
			} else if s != nil {
				if _, isMap := val.(map[string]any); isMap {
					return fmt.Errorf("%s: want a value, got a map", key)
				}
				continue
			}
			if sub, ok := val.(map[string]any); ok && isSection(key) {
				if err := walk(key+".", sub); err != nil {
					return err
				}
				continue
			}
			if key == "postgres.password" {
				return errors.New(postgresPasswordKeyMsg)
			}
			msg := fmt.Sprintf("unknown key %q", key)
			if near := nearestKey(key); near != "" {
				msg += fmt.Sprintf("; did you mean %q?", near)
			}
			return errors.New(msg)
		}
		return nil
	}
	err := walk("", doc)
	return maps, outboxTables, err
}

// envNotSettings are the RELAY_* variables the binary reads that are not a
// key's: the password that must never be a key of the file, and the
// developers' profiles (profile.go).
var envNotSettings = []string{postgresRelayPasswordEnv, "RELAY_CPUPROFILE", "RELAY_MEMPROFILE", "RELAY_TRACE", "RELAY_STAGES"}

// envToolingPrefixes are the project's own tooling's variables (tests, the
// dev servers, benchmarks): they are exported where the binary runs under
// tests, so they are neither settings nor mistakes.
var envToolingPrefixes = []string{"RELAY_TEST_", "RELAY_DEV_", "RELAY_FAULT", "RELAY_HOSTILE_", "RELAY_BENCH_", "RELAY_REPLAY_", "RELAY_REGEN_"}

// checkEnv looks at every RELAY_* variable of environ. One that is within
// three edits of a setting's variable is an error naming it: a misspelt
// optional key (RELAY_KAFKA_COMPRESION) would otherwise be ignored without a
// word, as a misspelt key of the file is not. Any other unknown one is
// returned, to be warned about: a variable far from every key is more likely
// some other program's than a typo, and refusing to start for it would make
// the relay fragile in a shared environment.
func checkEnv(environ []string) (unknown []string, err error) {
	var errs []error
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "RELAY_") || slices.Contains(envNotSettings, name) ||
			slices.ContainsFunc(envToolingPrefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		best, bestDist := "", 4
		for _, s := range settings {
			d := editDistance(name, envName(s.key))
			if d == 0 {
				best, bestDist = "", 0
				break
			}
			if d < bestDist {
				best, bestDist = s.key, d
			}
		}
		switch {
		case bestDist == 0:
		case best != "":
			errs = append(errs, fmt.Errorf("environment variable %s names no setting; did you mean %s (%s)? Rename it, or unset it", name, envName(best), best))
		default:
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return unknown, errors.Join(errs...)
}

func isSection(prefix string) bool {
	return slices.ContainsFunc(settings, func(s setting) bool { return strings.HasPrefix(s.key, prefix+".") })
}

// nearestKey suggests the known key closest to a mistyped one.
func nearestKey(key string) string {
	best, bestDist := "", 4 // farther than 3 edits is no suggestion
	for _, s := range settings {
		if d := editDistance(strings.ToLower(key), s.key); d < bestDist {
			best, bestDist = s.key, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
