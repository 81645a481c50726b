package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
)

// PauseKafka freezes the broker (SIGSTOP, or a paused container) and returns at once.
// Unlike StopKafka its connections stay open and new ones are still accepted by the
// kernel, so clients hang until their timeouts instead of failing fast, as in a network
// partition. Call ResumeKafka before StartKafka or StopKafka's restart: a frozen broker
// never answers. The caller must hold Exclusive.
func PauseKafka(t testing.TB) {
	t.Helper()
	requireExclusive(t, "PauseKafka")
	brokers := kafkaBrokers(t)
	if c := containers.kafka; c != nil {
		pauseContainer(t, c, true)
		return
	}
	checkDevPort(t, "RELAY_DEV_KAFKA_PORT", defaultDevKafkaPort, brokerPort(brokers[0]))
	runDev(t, "kafka-pause")
}

// ResumeKafka thaws a broker frozen by PauseKafka and returns once it answers metadata
// requests. The caller must hold Exclusive.
func ResumeKafka(t testing.TB) {
	t.Helper()
	requireExclusive(t, "ResumeKafka")
	brokers := kafkaBrokers(t)
	if c := containers.kafka; c != nil {
		pauseContainer(t, c, false)
	} else {
		checkDevPort(t, "RELAY_DEV_KAFKA_PORT", defaultDevKafkaPort, brokerPort(brokers[0]))
		runDev(t, "kafka-resume")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkaAnswers(ctx, brokers); err != nil {
		t.Fatalf("testenv: ResumeKafka: %v", err)
	}
}

// pauseContainer pauses or unpauses c through the Docker API: testcontainers has no
// call of its own for it.
func pauseContainer(t testing.TB, c testcontainers.Container, pause bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatalf("testenv: docker client: %v", err)
	}
	defer cli.Close()
	if pause {
		err = cli.ContainerPause(ctx, c.GetContainerID())
	} else {
		err = cli.ContainerUnpause(ctx, c.GetContainerID())
	}
	if err != nil {
		t.Fatalf("testenv: pause container (%v): %v", pause, err)
	}
}
