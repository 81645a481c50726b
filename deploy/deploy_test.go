// Package deploy holds the Kubernetes manifests and the Helm chart; its tests
// hold deploy/kubernetes/outbox-relay.yaml (the chart rendered with
// deploy/kubernetes/values.yaml, kept in step by scripts/validate-deploy.sh) to
// what the relay needs from a pod, and run the relay as the manifests run it.
//
// The schema checks (kubeconform, helm lint) are in scripts/validate-deploy.sh;
// these tests check what no schema knows: that the probes, the grace period,
// the memory limit and the config file fit the relay.
package deploy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

const manifestPath = "kubernetes/outbox-relay.yaml"

// manifests is deploy/kubernetes/outbox-relay.yaml by kind.
type manifests map[string]map[string]any

func load(t *testing.T) manifests {
	t.Helper()
	b, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	m := manifests{}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", manifestPath, err)
		}
		if doc == nil {
			continue
		}
		kind, _ := doc["kind"].(string)
		if _, dup := m[kind]; dup {
			t.Fatalf("%s: two %s documents; the tests expect one", manifestPath, kind)
		}
		m[kind] = doc
	}
	for _, kind := range []string{"Deployment", "ConfigMap", "Service", "PodDisruptionBudget", "ServiceAccount"} {
		if m[kind] == nil {
			t.Fatalf("%s: no %s", manifestPath, kind)
		}
	}
	return m
}

// dig walks maps by key and lists by index ("0").
func dig(v any, path ...string) any {
	for _, p := range path {
		switch n := v.(type) {
		case map[string]any:
			v = n[p]
		case []any:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i >= len(n) {
				return nil
			}
			v = n[i]
		default:
			return nil
		}
	}
	return v
}

func (m manifests) container() map[string]any {
	c, _ := dig(m["Deployment"], "spec", "template", "spec", "containers", "0").(map[string]any)
	return c
}

// env is the container's plain (value:) environment variables.
func (m manifests) env() map[string]string {
	out := map[string]string{}
	list, _ := m.container()["env"].([]any)
	for _, e := range list {
		name, _ := dig(e, "name").(string)
		if v, ok := dig(e, "value").(string); ok {
			out[name] = v
		}
	}
	return out
}

// config is the relay's config file, from the ConfigMap.
func (m manifests) config(t *testing.T) (raw string, cfg map[string]any) {
	t.Helper()
	raw, _ = dig(m["ConfigMap"], "data", "config.yaml").(string)
	if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil || cfg == nil {
		t.Fatalf("ConfigMap data config.yaml = %q: %v", raw, err)
	}
	return raw, cfg
}

func asInt(t *testing.T, v any, what string) int {
	t.Helper()
	n, ok := v.(int)
	if !ok {
		t.Fatalf("%s = %#v; want an integer", what, v)
	}
	return n
}

func TestManifests(t *testing.T) {
	m := load(t)
	dep := m["Deployment"]
	c := m.container()
	_, cfg := m.config(t)

	checks := []struct {
		what string
		path []string
		want any
	}{
		{"replicas", []string{"spec", "replicas"}, 2},
		{"strategy", []string{"spec", "strategy", "type"}, "RollingUpdate"},
		{"maxUnavailable", []string{"spec", "strategy", "rollingUpdate", "maxUnavailable"}, 0},
		{"maxSurge", []string{"spec", "strategy", "rollingUpdate", "maxSurge"}, 1},
		{"runAsNonRoot", []string{"spec", "template", "spec", "securityContext", "runAsNonRoot"}, true},
		// runAsNonRoot cannot check the image's USER nonroot by name: the kubelet
		// refuses to start it unless runAsUser is a number.
		{"runAsUser", []string{"spec", "template", "spec", "securityContext", "runAsUser"}, 65532},
		{"seccomp", []string{"spec", "template", "spec", "securityContext", "seccompProfile", "type"}, "RuntimeDefault"},
		{"service account token", []string{"spec", "template", "spec", "automountServiceAccountToken"}, false},
		{"anti-affinity topology", []string{"spec", "template", "spec", "affinity", "podAntiAffinity",
			"preferredDuringSchedulingIgnoredDuringExecution", "0", "podAffinityTerm", "topologyKey"}, "kubernetes.io/hostname"},
		{"scrape annotation", []string{"spec", "template", "metadata", "annotations", "prometheus.io/scrape"}, "true"},
		{"scrape port", []string{"spec", "template", "metadata", "annotations", "prometheus.io/port"}, "9187"},
	}
	for _, tc := range checks {
		if got := dig(dep, tc.path...); got != tc.want {
			t.Errorf("Deployment %s (%s) = %#v; want %#v", tc.what, strings.Join(tc.path, "."), got, tc.want)
		}
	}
	containerChecks := []struct {
		path []string
		want any
	}{
		{[]string{"ports", "0", "name"}, "metrics"},
		{[]string{"ports", "0", "containerPort"}, 9187},
		{[]string{"securityContext", "readOnlyRootFilesystem"}, true},
		{[]string{"securityContext", "allowPrivilegeEscalation"}, false},
		{[]string{"securityContext", "capabilities", "drop", "0"}, "ALL"},
		{[]string{"resources", "requests", "memory"}, "64Mi"},
		{[]string{"resources", "requests", "cpu"}, "100m"},
		{[]string{"resources", "limits", "memory"}, "128Mi"},
		// No CPU limit: throttling only delays delivery.
		{[]string{"resources", "limits", "cpu"}, nil},
		{[]string{"startupProbe", "httpGet", "path"}, "/healthz"},
		{[]string{"startupProbe", "httpGet", "port"}, "metrics"},
		{[]string{"livenessProbe", "httpGet", "path"}, "/healthz"},
		{[]string{"livenessProbe", "httpGet", "port"}, "metrics"},
		{[]string{"livenessProbe", "periodSeconds"}, 10},
		{[]string{"livenessProbe", "failureThreshold"}, 6},
		{[]string{"readinessProbe", "httpGet", "path"}, "/readyz"},
		{[]string{"readinessProbe", "httpGet", "port"}, "metrics"},
	}
	for _, tc := range containerChecks {
		if got := dig(c, tc.path...); got != tc.want {
			t.Errorf("container %s = %#v; want %#v", strings.Join(tc.path, "."), got, tc.want)
		}
	}

	// The probes must reach the listener: in a pod it cannot stay on loopback.
	if got := m.env()["RELAY_METRICS_LISTEN"]; got != "0.0.0.0:9187" {
		t.Errorf("RELAY_METRICS_LISTEN = %q; want 0.0.0.0:9187 (the container port, on every interface)", got)
	}
	// A slow /readyz must answer 503 before the kubelet gives up on it.
	if got := asInt(t, dig(c, "readinessProbe", "timeoutSeconds"), "readinessProbe.timeoutSeconds"); time.Duration(got)*time.Second <= metrics.ReadyTimeout {
		t.Errorf("readinessProbe.timeoutSeconds = %d; want more than metrics.ReadyTimeout (%v)", got, metrics.ReadyTimeout)
	}

	// SIGTERM -> drain for up to pipeline.shutdown_timeout -> checkpoint -> exit 0,
	// all before the SIGKILL.
	st, _ := dig(cfg, "pipeline", "shutdown_timeout").(string)
	shutdown, err := time.ParseDuration(st)
	if err != nil {
		t.Fatalf("config pipeline.shutdown_timeout = %q: %v; the chart writes it from shutdownTimeoutSeconds", st, err)
	}
	grace := time.Duration(asInt(t, dig(dep, "spec", "template", "spec", "terminationGracePeriodSeconds"), "terminationGracePeriodSeconds")) * time.Second
	if grace <= shutdown+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds = %v; want more than pipeline.shutdown_timeout (%v) + 5s", grace, shutdown)
	}

	// No GOMEMLIMIT: the relay derives its soft limit, 32 MiB + 2 x
	// pipeline.max_in_flight_bytes (default 8 MiB), which must leave the
	// runtime's other memory room under the container's limit.
	if v, ok := m.env()["GOMEMLIMIT"]; ok {
		t.Errorf("GOMEMLIMIT = %q; want it unset, so the relay's own soft limit applies", v)
	}
	window := 8 << 20
	if v, ok := dig(cfg, "pipeline", "max_in_flight_bytes").(int); ok {
		window = v
	}
	if soft, limit := 32<<20+2*window, 128<<20; soft*10 > limit*8 {
		t.Errorf("soft memory limit %d MiB is above 80%% of the 128Mi limit", soft>>20)
	}

	// Credentials only from the Secret, never in the ConfigMap.
	if _, ok := m["Secret"]; ok {
		t.Errorf("the plain manifests contain a Secret; it is the user's to create")
	}
	dsn, _ := dig(cfg, "postgres", "dsn").(string)
	if u, err := url.Parse(dsn); err != nil || u.User == nil {
		t.Errorf("config postgres.dsn = %q; want a URL with a user", dsn)
	} else if _, has := u.User.Password(); has {
		t.Errorf("config postgres.dsn has a password; it belongs in the Secret")
	}
	if got, want := m.env()["RELAY_POSTGRES_PASSWORD_FILE"], "/etc/outbox-relay/secrets/postgres-password"; got != want {
		t.Errorf("RELAY_POSTGRES_PASSWORD_FILE = %q; want %q", got, want)
	}

	// PDB: one pod at a time, selecting exactly the Deployment's pods.
	pdb := m["PodDisruptionBudget"]
	if got := dig(pdb, "spec", "minAvailable"); got != 1 {
		t.Errorf("PodDisruptionBudget minAvailable = %#v; want 1", got)
	}
	if got, want := fmt.Sprint(dig(pdb, "spec", "selector", "matchLabels")), fmt.Sprint(dig(dep, "spec", "selector", "matchLabels")); got != want {
		t.Errorf("PodDisruptionBudget selector = %s; want the Deployment's %s", got, want)
	}
	svc := m["Service"]
	if got := dig(svc, "spec", "ports", "0", "name"); got != "metrics" {
		t.Errorf("Service port name = %#v; want metrics", got)
	}
	if got := dig(svc, "spec", "publishNotReadyAddresses"); got != true {
		t.Errorf("Service publishNotReadyAddresses = %#v; want true (a stalled leader is not Ready, and its metrics matter then)", got)
	}
}

// relayProc is one replica: the relay run with the container's args and env.
type relayProc struct {
	name    string
	cmd     *exec.Cmd
	metrics string // base URL of the metrics listener
	done    chan error
	log     *os.File
}

func (p *relayProc) get(path string) (int, string, error) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(p.metrics + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

var activeRe = regexp.MustCompile(`(?m)^outbox_relay_active(?:\{[^}]*\})? (\S+)$`)

// active is the outbox_relay_active gauge: "1" leader, "0" standby.
func (p *relayProc) active() string {
	code, body, err := p.get("/metrics")
	if err != nil || code != http.StatusOK {
		return ""
	}
	if m := activeRe.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return ""
}

// TestManifestsRunRelay runs the relay as deploy/kubernetes/outbox-relay.yaml
// does, against real Postgres and Kafka: the ConfigMap's config file (with the
// test's servers), the container's args and environment, the password as a
// Secret file, as many replicas as the Deployment. Every replica must pass its
// startup and readiness probes on the manifest's paths, exactly one must lead
// and deliver, a SIGTERM must end it with exit 0 within the grace period, and
// the standby must take over and deliver.
func TestManifestsRunRelay(t *testing.T) {
	m := load(t)
	pg := testenv.Postgres(t)
	kafka := testenv.Kafka(t)
	bin := testenv.RelayBinary(t)
	dir := t.TempDir()

	_, cfg := m.config(t)
	// The test's servers instead of the placeholders, the password moved into a
	// file as the Secret volume holds it.
	u, err := url.Parse(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	u.User = url.User(u.User.Username())
	secretDir := filepath.Join(dir, "secrets")
	if err := os.Mkdir(secretDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The kubelet writes a Secret's value as it is; kubectl create secret
	// --from-file keeps the file's trailing newline.
	if err := os.WriteFile(filepath.Join(secretDir, "postgres-password"), []byte(password+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	slot := testenv.UniqueName(t, "slot")
	postgres, _ := cfg["postgres"].(map[string]any)
	postgres["dsn"] = u.String()
	postgres["slot"] = slot
	postgres["publication"] = slot
	cfg["kafka"].(map[string]any)["brokers"] = kafka.Brokers
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	configDir := filepath.Join(dir, "config")
	if err := os.Mkdir(configDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(configDir, "config.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Paths in the pod -> paths here.
	remap := strings.NewReplacer("/etc/outbox-relay/config", configDir, "/etc/outbox-relay/secrets", secretDir)

	// The pod's environment, and nothing of this process's RELAY_* (make
	// dev-env exports RELAY_POSTGRES_DSN, which would override the file).
	baseEnv := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") && !strings.HasPrefix(kv, "GOMEMLIMIT=") && !strings.HasPrefix(kv, "PG") {
			baseEnv = append(baseEnv, kv)
		}
	}
	podEnv := func(metricsAddr string) []string {
		env := append([]string{}, baseEnv...)
		for k, v := range m.env() {
			if k == "RELAY_METRICS_LISTEN" {
				v = metricsAddr // 0.0.0.0 in the pod; loopback only here
			}
			env = append(env, k+"="+remap.Replace(v))
		}
		return env
	}
	args := func() []string {
		var out []string
		list, _ := m.container()["args"].([]any)
		for _, a := range list {
			out = append(out, remap.Replace(fmt.Sprint(a)))
		}
		return out
	}()
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("container args = %q; want run first", args)
	}

	// What `setup.enabled` (or an operator, once) runs before the relay.
	setup := exec.Command(bin, append([]string{"setup", "--create-outbox-table"}, args[1:]...)...)
	setup.Env = podEnv("")
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("outbox-relay setup: %v\n%s", err, out)
	}

	aggregateType := testenv.UniqueName(t, "deploy")
	topic := "outbox.event." + aggregateType
	kafka.CreateTopic(t, topic, 1)

	replicas := asInt(t, dig(m["Deployment"], "spec", "replicas"), "replicas")
	c := m.container()
	startupBudget := time.Duration(asInt(t, dig(c, "startupProbe", "periodSeconds"), "startupProbe.periodSeconds")*
		asInt(t, dig(c, "startupProbe", "failureThreshold"), "startupProbe.failureThreshold")) * time.Second
	grace := time.Duration(asInt(t, dig(m["Deployment"], "spec", "template", "spec", "terminationGracePeriodSeconds"), "terminationGracePeriodSeconds")) * time.Second
	startupPath, _ := dig(c, "startupProbe", "httpGet", "path").(string)
	livenessPath, _ := dig(c, "livenessProbe", "httpGet", "path").(string)
	readinessPath, _ := dig(c, "readinessProbe", "httpGet", "path").(string)

	procs := make([]*relayProc, replicas)
	for i := range procs {
		addr := testenv.FreeAddr(t)
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("relay-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		p := &relayProc{name: fmt.Sprintf("replica %d", i), metrics: "http://" + addr, done: make(chan error, 1), log: logf}
		p.cmd = exec.Command(bin, args...)
		p.cmd.Env = podEnv(addr)
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.done <- p.cmd.Wait() }()
		procs[i] = p
		t.Cleanup(func() {
			select {
			case <-p.done:
			default:
				p.cmd.Process.Kill()
				<-p.done
			}
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%s", p.name, b)
			}
		})
	}

	// The kubelet's view: startup, then liveness and readiness, on every replica.
	begin := time.Now()
	for _, p := range procs {
		waitFor(t, startupBudget, p.name+" startup probe "+startupPath, func() error { return probe(p, startupPath) })
		waitFor(t, time.Minute, p.name+" readiness probe "+readinessPath, func() error { return probe(p, readinessPath) })
		if err := probe(p, livenessPath); err != nil {
			t.Fatalf("%s liveness probe %s: %v", p.name, livenessPath, err)
		}
	}
	leader := waitLeader(t, procs)
	t.Logf("%d replicas Ready, %s leads, after %v", replicas, leader.name, time.Since(begin).Round(time.Millisecond))

	insert := func(id string) {
		pg.Exec(t, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1, $2, 'a1', 'Tested', '{"deploy":true}')`, id, aggregateType)
	}
	insert("00000000-0000-4000-8000-000000000001")
	waitMessages(t, kafka, topic, 1)

	// A rolling update or a drain: SIGTERM, exit 0 within the grace period.
	start := time.Now()
	if err := leader.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-leader.done:
		leader.done <- err // for the cleanup
		if err != nil {
			t.Fatalf("%s after SIGTERM: %v; want exit 0", leader.name, err)
		}
		t.Logf("%s (leader) exited 0 %v after SIGTERM", leader.name, time.Since(start).Round(time.Millisecond))
	case <-time.After(grace):
		t.Fatalf("%s still running %v after SIGTERM (terminationGracePeriodSeconds): the kubelet would SIGKILL it", leader.name, grace)
	}

	var rest []*relayProc
	for _, p := range procs {
		if p != leader {
			rest = append(rest, p)
		}
	}
	if len(rest) == 0 {
		return
	}
	next := waitLeader(t, rest)
	insert("00000000-0000-4000-8000-000000000002")
	waitMessages(t, kafka, topic, 2)
	t.Logf("%s took over and delivered %v after the SIGTERM", next.name, time.Since(start).Round(time.Millisecond))
	if err := probe(next, readinessPath); err != nil {
		t.Errorf("%s (new leader) readiness: %v", next.name, err)
	}
	for _, p := range rest {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-p.done:
			p.done <- err
			if err != nil {
				t.Errorf("%s after SIGTERM: %v; want exit 0", p.name, err)
			}
		case <-time.After(grace):
			t.Errorf("%s still running %v after SIGTERM", p.name, grace)
		}
	}
}

func probe(p *relayProc, path string) error {
	code, body, err := p.get(path)
	if err != nil {
		return err
	}
	if code < 200 || code >= 400 { // the kubelet's success range
		return fmt.Errorf("HTTP %d: %s", code, strings.TrimSpace(body))
	}
	return nil
}

// waitLeader waits until exactly one of procs reports outbox_relay_active 1
// and the others 0, and returns the leader.
func waitLeader(t *testing.T, procs []*relayProc) *relayProc {
	t.Helper()
	var leader *relayProc
	waitFor(t, time.Minute, "exactly one leader (outbox_relay_active 1, the others 0)", func() error {
		leader = nil
		var states []string
		for _, p := range procs {
			a := p.active()
			states = append(states, p.name+"="+a)
			switch a {
			case "1":
				if leader != nil {
					return fmt.Errorf("two leaders: %s", strings.Join(states, " "))
				}
				leader = p
			case "0":
			default:
				return fmt.Errorf("no outbox_relay_active gauge: %s", strings.Join(states, " "))
			}
		}
		if leader == nil {
			return fmt.Errorf("no leader: %s", strings.Join(states, " "))
		}
		return nil
	})
	return leader
}

func waitMessages(t *testing.T, k *testenv.KafkaCluster, topic string, n int) {
	t.Helper()
	waitFor(t, time.Minute, fmt.Sprintf("%d messages on %s", n, topic), func() error {
		if got := len(k.ReadAll(t, topic)); got < n {
			return fmt.Errorf("%d messages", got)
		}
		return nil
	})
}

func waitFor(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waited %v for %s: %v", d, what, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
