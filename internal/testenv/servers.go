package testenv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"
)

const (
	postgresImage = "postgres:15-alpine"
	// Apache Kafka's own image, the version the dev servers run, in KRaft
	// mode (one node that is broker and controller).
	kafkaImage = "apache/kafka:3.9.1"
)

// containers holds this binary's containers, started on first use.
var containers struct {
	dockerOnce sync.Once
	docker     bool

	pgOnce   sync.Once
	pgDSN    string
	pgErr    error
	postgres testcontainers.Container

	kafkaOnce  sync.Once
	kafkaAddrs []string
	kafkaErr   error
	kafka      testcontainers.Container
}

// short is testing.Short, replaced by TestSkipUnlessServers.
var short = testing.Short

// skipUnlessServers skips t under `go test -short` when an environment variable of
// envs is unset: a unit run needs no servers and starts no containers. Without -short
// (`make test`, CI) it does nothing, and a missing server is a failure.
func skipUnlessServers(t testing.TB, envs ...string) {
	t.Helper()
	if !short() {
		return
	}
	for _, env := range envs {
		if os.Getenv(env) == "" {
			t.Skipf("testenv: integration test skipped under -short: %s is not set; %s", env, howToRun)
		}
	}
}

// postgresAdminDSN returns the DSN of the server's default database, from the
// environment or a container, and fails the test when there is neither (skips it
// under -short).
func postgresAdminDSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv(envPostgresDSN); dsn != "" {
		return dsn
	}
	fromContainer(t, "Postgres", envPostgresDSN, &containers.pgOnce, &containers.pgErr, func() (err error) {
		containers.pgDSN, containers.postgres, err = startPostgresContainer()
		return err
	})
	return containers.pgDSN
}

// kafkaBrokers returns the brokers, from the environment or a container, and fails
// the test when there is neither (skips it under -short).
func kafkaBrokers(t testing.TB) []string {
	t.Helper()
	if v := os.Getenv(envKafkaBrokers); v != "" {
		var out []string
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				out = append(out, b)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	fromContainer(t, "Kafka", envKafkaBrokers, &containers.kafkaOnce, &containers.kafkaErr, func() (err error) {
		containers.kafkaAddrs, containers.kafka, err = startKafkaContainer()
		return err
	})
	return containers.kafkaAddrs
}

// fromContainer is the way to a server whose variable env is unset: skip t
// under -short, fail it without a Docker engine, else start the server's
// container once per binary (start, its error kept in *err) and fail t when
// that failed.
func fromContainer(t testing.TB, what, env string, once *sync.Once, err *error, start func() error) {
	t.Helper()
	skipUnlessServers(t, env)
	if !dockerAvailable() {
		t.Fatalf("testenv: no %s: %s is not set and no Docker engine answers; %s", what, env, howToStart)
	}
	once.Do(func() { *err = start() })
	if *err != nil {
		t.Fatalf("testenv: %s container: %v", what, *err)
	}
}

// dockerAvailable reports whether a Docker engine answers. testcontainers panics or
// skips without one; here its absence only means "no containers".
func dockerAvailable() bool {
	containers.dockerOnce.Do(func() {
		containers.docker = func() (ok bool) {
			defer func() {
				if recover() != nil {
					ok = false
				}
			}()
			provider, err := testcontainers.ProviderDocker.GetProvider()
			if err != nil {
				return false
			}
			defer provider.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return provider.Health(ctx) == nil
		}()
	})
	return containers.docker
}

// freePort returns a loopback port that was free a moment ago. Containers are bound to
// fixed host ports so that a stopped and restarted container keeps its address (Docker
// picks a new random port on every start otherwise).
func freePort() (string, error) {
	ports, err := serverPorts(1)
	if err != nil {
		return "", err
	}
	return strconv.Itoa(ports[0]), nil
}

func bindPort(containerPort nat.Port, hostPort string) testcontainers.CustomizeRequestOption {
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
		if hc.PortBindings == nil {
			hc.PortBindings = nat.PortMap{}
		}
		hc.PortBindings[containerPort] = []nat.PortBinding{{HostIP: "127.0.0.1", HostPort: hostPort}}
	})
}

func startPostgresContainer() (string, testcontainers.Container, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	port, err := freePort()
	if err != nil {
		return "", nil, fmt.Errorf("pick port: %w", err)
	}
	c, err := tcpostgres.Run(ctx, postgresImage,
		tcpostgres.WithDatabase("outbox"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		testcontainers.WithCmd("postgres", "-c", "fsync=off", "-c", "wal_level=logical",
			"-c", "max_replication_slots=32", "-c", "max_wal_senders=32", "-c", "max_connections=200"),
		bindPort("5432/tcp", port),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", nil, err
	}
	dsn, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", nil, fmt.Errorf("connection string: %w", err)
	}
	return dsn, c, nil
}

func startKafkaContainer() ([]string, testcontainers.Container, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	port, err := freePort()
	if err != nil {
		return nil, nil, fmt.Errorf("pick port: %w", err)
	}
	// Started from the image rather than testcontainers' kafka module, which
	// would bring a second Kafka client (sarama) into go.mod. The listener is
	// advertised at the host port bound below, so clients need no
	// translation.
	addr := "127.0.0.1:" + port
	c, err := testcontainers.Run(ctx, kafkaImage,
		testcontainers.WithEnv(map[string]string{
			"KAFKA_NODE_ID":                                  "1",
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_LISTENERS":                                "PLAINTEXT://:9092,CONTROLLER://:9093",
			"KAFKA_ADVERTISED_LISTENERS":                     "PLAINTEXT://" + addr,
			"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9093",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
			"KAFKA_NUM_PARTITIONS":                           "4",
			"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                "true",
		}),
		testcontainers.WithExposedPorts("9092/tcp"),
		bindPort("9092/tcp", port),
		testcontainers.WithWaitStrategy(wait.ForLog("Kafka Server started").WithStartupTimeout(3*time.Minute)),
	)
	if err != nil {
		return nil, nil, err
	}
	// The broker answers once its listener is up; kafkaAnswers (the
	// caller) waits for a metadata answer as for the dev servers.
	return []string{addr}, c, nil
}

func stopContainer(t testing.TB, c testcontainers.Container) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	zero := time.Duration(0) // SIGKILL at once: a crash, not a clean shutdown
	if err := c.Stop(ctx, &zero); err != nil {
		t.Fatalf("testenv: stop container: %v", err)
	}
}

func startContainer(t testing.TB, c testcontainers.Container) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("testenv: start container: %v", err)
	}
}
