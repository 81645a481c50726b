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
	kafkaFault(t, "PauseKafka", "kafka-pause", func(t testing.TB, c testcontainers.Container) { pauseContainer(t, c, true) }, false)
}

// ResumeKafka thaws a broker frozen by PauseKafka and returns once it answers metadata
// requests. The caller must hold Exclusive.
func ResumeKafka(t testing.TB) {
	t.Helper()
	kafkaFault(t, "ResumeKafka", "kafka-resume", func(t testing.TB, c testcontainers.Container) { pauseContainer(t, c, false) }, true)
}

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
