package deploy

import (
	"encoding/json"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/internal/metrics"
)

const (
	dashboardPath = "grafana/outbox-relay.json"
	rulesPath     = "prometheus/alerts.yaml"
	repoURL       = "https://github.com/outbox-relay/outbox-relay/blob/main/"
)

// exported is every metric name the relay's registry describes, with the series
// names a histogram adds. Described, not gathered: a vector without children
// (events_delivered_total before the first event) is exported all the same.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		metrics.New().Registry().Describe(ch)
		close(ch)
	}()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range ch {
		m := fq.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		names[m[1]] = true
	}
	// Histograms and summaries expose these series beside their name.
	for n := range maps.Clone(names) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			names[n+suffix] = true
		}
	}
	if !names["outbox_relay_delivery_latency_seconds"] || !names["outbox_relay_slot_lag_bytes"] || !names["process_resident_memory_bytes"] {
		t.Fatalf("the registry describes %d names without the ones every panel relies on: %v", len(names), names)
	}
	return names
}

// metricRefs are the metric names a PromQL expression uses: the relay's own
// (outbox_relay_*) and the process and Go collectors' it exports.
var metricRefs = regexp.MustCompile(`\b(?:outbox_relay|process|go)_[a-zA-Z0-9_]+`)

// unknownMetrics returns the names expr uses that the relay does not export.
func unknownMetrics(expr string, names map[string]bool) []string {
	var bad []string
	for _, n := range metricRefs.FindAllString(expr, -1) {
		if !names[n] {
			bad = append(bad, n)
		}
	}
	return bad
}

// The check itself must catch a misspelt or invented metric, or it proves nothing.
func TestUnknownMetricsCaught(t *testing.T) {
	names := exported(t)
	for expr, want := range map[string][]string{
		`rate(outbox_relay_events_delivered_total[5m])`:                                    nil,
		`histogram_quantile(0.99, rate(outbox_relay_delivery_latency_seconds_bucket[5m]))`: nil,
		`outbox_relay_slot_lag_byte > 1`:                                                   {"outbox_relay_slot_lag_byte"},
		`sum(outbox_relay_leader) + process_resident_memory_bytes`:                         {"outbox_relay_leader"},
		`outbox_relay_events_delivered_bucket`:                                             {"outbox_relay_events_delivered_bucket"},
	} {
		if got := unknownMetrics(expr, names); !slices.Equal(got, want) {
			t.Errorf("unknownMetrics(%q) = %v; want %v", expr, got, want)
		}
	}
}

// Every panel of the shipped dashboard queries metrics the relay exports, through
// the dashboard's datasource variable, and the panels cover what an operator
// watches (each area named in the issue: throughput, latency, lag, WAL, retry
// table, dead letters, leadership, health, retention).
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	names := exported(t)
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if dash.UID == "" {
		t.Errorf("%s has no uid: imports would duplicate it", dashboardPath)
	}
	ids := map[int]bool{}
	used := map[string]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q uses datasource %q; want the ${datasource} variable, so it imports into any Grafana", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			if bad := unknownMetrics(q.Expr, names); len(bad) > 0 {
				t.Errorf("panel %q queries %v, which the relay does not export: %s", p.Title, bad, q.Expr)
			}
			if !strings.Contains(q.Expr, `instance=~"$instance"`) {
				t.Errorf("panel %q ignores the instance variable: %s", p.Title, q.Expr)
			}
			for _, n := range metricRefs.FindAllString(q.Expr, -1) {
				used[n] = true
			}
		}
	}
	for _, want := range []string{
		"outbox_relay_events_delivered_total", "outbox_relay_delivery_latency_seconds_bucket",
		"outbox_relay_slot_lag_bytes", "outbox_relay_slot_retained_wal_bytes", "outbox_relay_slot_wal_status",
		"outbox_relay_stalled_seconds", "outbox_relay_retry_pending_events", "outbox_relay_retry_dead_events",
		"outbox_relay_retry_oldest_pending_age_seconds", "outbox_relay_active", "outbox_relay_leader_epoch",
		"outbox_relay_takeovers_total", "outbox_relay_health_failing", "outbox_relay_retention_lag_seconds",
		"outbox_relay_slot_gap",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
	t.Logf("%d panels, %d queries, %d metrics", len(dash.Panels), queries, len(used))
}

// The alert rules use only exported metrics, and every runbook link leads to a
// heading that exists in this repository.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	names := exported(t)
	b, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if bad := unknownMetrics(r.Expr, names); len(bad) > 0 {
				t.Errorf("alert %s uses %v, which the relay does not export: %s", r.Alert, bad, r.Expr)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s lacks a severity, summary or description", r.Alert)
			}
			if err := checkRunbook(r.Annotations["runbook_url"]); err != "" {
				t.Errorf("alert %s: %s", r.Alert, err)
			}
		}
	}
	if n < 15 {
		t.Errorf("%s has %d alerts; want the whole alert table", rulesPath, n)
	}
}

// checkRunbook says what is wrong with a runbook URL, or "".
func checkRunbook(link string) string {
	if !strings.HasPrefix(link, repoURL) {
		return "runbook_url " + link + " does not point into " + repoURL
	}
	u, err := url.Parse(link)
	if err != nil {
		return err.Error()
	}
	file := filepath.Join("..", strings.TrimPrefix(u.Path, "/outbox-relay/outbox-relay/blob/main/"))
	b, err := os.ReadFile(file)
	if err != nil {
		return "runbook_url " + link + ": " + err.Error()
	}
	if u.Fragment != "" && !slices.Contains(anchors(string(b)), u.Fragment) {
		return "runbook_url " + link + ": no heading in " + file + " has the anchor #" + u.Fragment
	}
	return ""
}

// anchors are the GitHub anchors of a Markdown file's headings.
func anchors(md string) []string {
	var out []string
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			seen[a]++
			a += "-" + strconv.Itoa(k)
		} else {
			seen[a] = 1
		}
		out = append(out, a)
	}
	return out
}

// The runbook check must refuse a link into nowhere.
func TestRunbookCheckCatchesBrokenLinks(t *testing.T) {
	for link, ok := range map[string]bool{
		repoURL + "docs/failover.md#when-the-slot-is-lost-or-replaced": true,
		repoURL + "docs/failover.md#no-such-heading":                   false,
		repoURL + "docs/nowhere.md":                                    false,
		"https://example.com/runbook":                                  false,
	} {
		if got := checkRunbook(link) == ""; got != ok {
			t.Errorf("checkRunbook(%s) ok = %v; want %v (%s)", link, got, ok, checkRunbook(link))
		}
	}
}
