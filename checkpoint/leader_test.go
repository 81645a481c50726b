package checkpoint_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestHoldEpoch: a transaction that holds the leader's epoch keeps a rival's
// takeover waiting until it ends, and a former leader's hold is refused, so
// that what it would write in the transaction is not written.
func TestHoldEpoch(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	tbl, _ := sql.ParseTable("outbox_relay_checkpoint")
	if _, err := pool.Exec(ctx, sql.CheckpointTable(tbl)); err != nil {
		t.Fatal(err)
	}
	s := checkpoint.New(pool, "outbox_relay_checkpoint")
	epoch, err := s.TakeOver(ctx, "slot", "first", checkpoint.Server{})
	if err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.HoldEpoch(ctx, tx, "slot", epoch); err != nil {
		t.Fatalf("HoldEpoch(leader's epoch %d) = %v; want nil", epoch, err)
	}
	took := make(chan int64, 1)
	go func() {
		e, err := s.TakeOver(ctx, "slot", "rival", checkpoint.Server{})
		if err != nil {
			t.Errorf("rival TakeOver: %v", err)
		}
		took <- e
	}()
	select {
	case e := <-took:
		t.Fatalf("a rival took over (epoch %d) while the leader held its epoch", e)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	newer := <-took
	if newer <= epoch {
		t.Fatalf("rival's epoch %d; want more than %d", newer, epoch)
	}

	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	err = s.HoldEpoch(ctx, tx, "slot", epoch)
	var fe *checkpoint.FencedError
	if !errors.As(err, &fe) || fe.Newest != newer || fe.Leader != "rival" {
		t.Fatalf("HoldEpoch(former epoch %d) = %v; want a *FencedError naming epoch %d of rival", epoch, err, newer)
	}
}
