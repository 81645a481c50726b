package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// created records every database, slot and topic the bench made, so that the
// end of an invocation can check that none is left behind: cleanup is
// best-effort on a shared server (an autovacuum worker, a Ctrl-C in the middle
// of a drop), and a silent leftover slot retains WAL until the disk fills.
type created struct {
	mu     sync.Mutex
	dbs    []string
	slots  []string
	topics []string
}

func (c *created) addDB(name string) {
	c.mu.Lock()
	c.dbs = append(c.dbs, name)
	c.mu.Unlock()
}

func (c *created) addSlots(names ...string) {
	c.mu.Lock()
	c.slots = append(c.slots, names...)
	c.mu.Unlock()
}

func (c *created) addTopics(names ...string) {
	c.mu.Lock()
	c.topics = append(c.topics, names...)
	c.mu.Unlock()
}

// leftBehind returns what still exists of what was created, each as
// "database x", "slot y" or "topic z", with the command that removes it.
func (c *created) leftBehind(ctx context.Context, adminDSN string, client *kafka.Client) ([]string, error) {
	c.mu.Lock()
	dbs, slots, topics := slices.Clone(c.dbs), slices.Clone(c.slots), slices.Clone(c.topics)
	c.mu.Unlock()
	var left []string
	var errs []error
	if len(dbs)+len(slots) > 0 {
		conn, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			return nil, fmt.Errorf("connect: %w", err)
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, "SELECT slot_name::text, active FROM pg_replication_slots WHERE slot_name = ANY($1) ORDER BY 1", slots)
		if err == nil {
			for rows.Next() {
				var name string
				var active bool
				if err := rows.Scan(&name, &active); err != nil {
					errs = append(errs, err)
					break
				}
				left = append(left, fmt.Sprintf("slot %s (active %v): SELECT pg_drop_replication_slot('%s')", name, active, name))
			}
			rows.Close()
			err = rows.Err()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("list slots: %w", err))
		}
		names, err := pgxStrings(ctx, conn, "SELECT datname::text FROM pg_database WHERE datname = ANY($1) ORDER BY 1", dbs)
		if err != nil {
			errs = append(errs, fmt.Errorf("list databases: %w", err))
		}
		for _, n := range names {
			left = append(left, fmt.Sprintf("database %s: DROP DATABASE %s WITH (FORCE) (as a superuser)", n, pgx.Identifier{n}.Sanitize()))
		}
	}
	if len(topics) > 0 {
		remaining, err := remainingTopics(ctx, client, topics)
		if err != nil {
			errs = append(errs, err)
		}
		for _, t := range remaining {
			left = append(left, "topic "+t)
		}
	}
	slices.Sort(left)
	return left, errors.Join(errs...)
}

func pgxStrings(ctx context.Context, conn *pgx.Conn, sql string, args ...any) ([]string, error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// topicDeleteWait bounds the wait for deleted topics to leave the metadata:
// Kafka deletes asynchronously, and DeleteTopics returns before the broker's
// metadata cache has caught up.
const topicDeleteWait = 15 * time.Second

// remainingTopics returns those of topics that still exist once deletions in
// flight have had topicDeleteWait to finish.
func remainingTopics(ctx context.Context, client *kafka.Client, topics []string) ([]string, error) {
	deadline := time.Now().Add(topicDeleteWait)
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: topics})
		if err != nil {
			return nil, fmt.Errorf("topic metadata: %w", err)
		}
		var left []string
		for _, t := range md.Topics {
			if t.Error == nil {
				left = append(left, t.Name)
			} else if !errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("topic %s: %w", t.Name, t.Error)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left, nil
		}
		select {
		case <-ctx.Done():
			return left, nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}
