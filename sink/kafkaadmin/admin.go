// Package kafkaadmin asks Kafka what the relay must know besides writes:
// whether a broker answers (Ping), whether it accepts the relay's settings
// (CheckAuth) and its producer id (CheckIdempotence), a topic's metadata
// and whether a name could be created (for the sink's topic diagnostics),
// the creation of the relay's compacted topics, the broker's transaction
// limit, and the relay's one read_committed reader (Reader, LastCommitted).
// It is franz-go's admin client (kadm) over a kgo client of
// package kafkaclient.
//
// Invariants enforced here:
//
//   - Ping sends a metadata request, never answered from a cache: it fails
//     while no broker answers.
//   - A read ends: Reader reads a partition up to its last stable offset as
//     it is when the read starts, and returns only committed records.
//   - LastCommitted reads the partition the producer writes the key to:
//     the Java client's murmur2 partitioner, kgo's default.
package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// An Admin asks one cluster, over one kgo client made at the first
// question. Its methods are safe for concurrent use.
type Admin struct {
	cfg kafkaclient.Config

	mu  sync.Mutex
	kc  *kgo.Client
	adm *kadm.Client // on kc
}

// New returns an Admin that connects as cfg says; cfg has been validated
// (kafkaclient.Config.Validate). It dials lazily.
func New(cfg kafkaclient.Config) *Admin { return &Admin{cfg: cfg} }

// admin returns the admin client, connecting as cfg says.
func (k *Admin) admin() (*kadm.Client, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.adm != nil {
		return k.adm, nil
	}
	cl, err := kafkaclient.New(&k.cfg)
	if err != nil {
		return nil, err
	}
	k.kc, k.adm = cl, kadm.NewClient(cl)
	return k.adm, nil
}

// Close closes the admin client's connections, if it was made.
func (k *Admin) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.adm != nil {
		k.kc.Close()
		k.kc, k.adm = nil, nil
	}
}

// Ping asks a broker for metadata (the brokers only, so that the answer's
// size does not grow with the cluster's topics) and returns nil once one
// answers, or an error when none does before ctx is done (or within
// WriteTimeout when ctx has no deadline). The request is sent, never
// answered from a cache, so it fails while no broker answers. For readiness
// checks and `check`; safe for concurrent use.
func (k *Admin) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	if _, err := k.admin(); err != nil {
		return err
	}
	// Not kadm's BrokerMetadata: it answers from kgo's metadata cache.
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{}
	start := time.Now()
	// kgo's dial is bounded by its own timeout, not by ctx: wait for ctx
	// alone (the request ends within that dial timeout).
	done := make(chan error, 1)
	go func() {
		_, err := req.RequestWith(ctx, k.kc)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer within %s: %w", time.Since(start).Round(time.Millisecond), err)
		}
		return fmt.Errorf("ping kafka %s: %w", strings.Join(k.cfg.Brokers, ","), err)
	}
	return nil
}

// LookTopic asks a broker for every topic's metadata and reports whether
// topic is known, and the name of an existing topic it collides with, if
// any. Both are false/"" when no broker answers. A diagnosis, made when a
// topic fails, not per write.
func (k *Admin) LookTopic(ctx context.Context, topic string) (known bool, collides string) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	adm, err := k.admin()
	if err != nil {
		return false, ""
	}
	topics, err := adm.ListTopicsWithInternal(ctx)
	if err != nil {
		return false, ""
	}
	u := UnifiedTopic(topic)
	for name, t := range topics {
		switch {
		case name == topic:
			known = t.Err == nil
		case UnifiedTopic(name) == u:
			collides = name
		}
	}
	return known, collides
}

// ValidateCreate asks Kafka whether topic could be created (CreateTopics with
// ValidateOnly and the broker's default partitions and replication factor,
// KIP-464), which is the only answer that carries Kafka's reason for refusing
// a name. It returns Kafka's message and code; a nil code means it could be
// created or the question could not be answered within a second.
// Nothing is created.
func (k *Admin) ValidateCreate(ctx context.Context, topic string) (string, *kerr.Error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	adm, err := k.admin()
	if err != nil {
		return "", nil
	}
	res, err := adm.ValidateCreateTopics(ctx, -1, -1, nil, topic)
	if err != nil {
		return "", nil
	}
	r, ok := res[topic]
	var ke *kerr.Error
	if !ok || !errors.As(r.Err, &ke) {
		return "", nil
	}
	return r.ErrMessage, ke
}

// CreateCompactedTopic creates topic with one partition, the broker's
// replication factor and cleanup.policy=compact (a relay's own topic of
// records keyed by a name, of which only the latest matters), and reports
// whether it did: false, nil when the topic exists already. Safe for
// concurrent use.
func (k *Admin) CreateCompactedTopic(ctx context.Context, topic string) (created bool, err error) {
	adm, err := k.admin()
	if err != nil {
		return false, err
	}
	// Asked first: a principal may describe a topic it may not create, and
	// Kafka refuses creating an existing topic to it as not authorized.
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return false, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	if t, ok := md.Topics[topic]; ok && t.Err == nil && len(t.Partitions) > 0 {
		return false, nil
	}
	compact, hourly := "compact", "3600000"
	res, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{
		"cleanup.policy": &compact,
		// Segments roll hourly, so that compaction, which skips the
		// active segment, keeps the topic near one record per key.
		"segment.ms": &hourly,
	}, topic)
	switch {
	case err == nil && res.Err == nil:
		return true, nil
	case errors.Is(err, kerr.TopicAlreadyExists), errors.Is(res.Err, kerr.TopicAlreadyExists):
		return false, nil
	case err == nil:
		err = res.Err
		if res.ErrMessage != "" {
			err = fmt.Errorf("%w: %s", err, res.ErrMessage)
		}
	}
	return false, fmt.Errorf("create topic %s: %w", topic, err)
}

// MaxTransactionTimeout reads the broker's transaction.max.timeout.ms
// (DescribeConfigs of one broker: every broker of a cluster should agree),
// the longest transaction timeout InitTransactions may ask for. The
// principal needs DESCRIBE_CONFIGS on the cluster. Safe for concurrent use.
func (k *Admin) MaxTransactionTimeout(ctx context.Context) (time.Duration, error) {
	const name = "transaction.max.timeout.ms"
	adm, err := k.admin()
	if err != nil {
		return 0, err
	}
	md, err := adm.BrokerMetadata(ctx)
	if err != nil {
		return 0, fmt.Errorf("read %s: metadata: %w", name, err)
	}
	if len(md.Brokers) == 0 {
		return 0, fmt.Errorf("read %s: the metadata lists no broker", name)
	}
	res, err := adm.DescribeBrokerConfigs(ctx, md.Brokers[0].NodeID)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	for _, r := range res {
		if r.Err != nil {
			return 0, fmt.Errorf("read %s of broker %s (the principal needs DESCRIBE_CONFIGS on the cluster): %w", name, r.Name, r.Err)
		}
		for _, c := range r.Configs {
			if c.Key != name {
				continue
			}
			v := ""
			if c.Value != nil {
				v = *c.Value
			}
			ms, err := strconv.ParseInt(v, 10, 64)
			if err != nil || ms <= 0 {
				return 0, fmt.Errorf("read %s: the broker's value %q is not a number of milliseconds", name, v)
			}
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	return 0, fmt.Errorf("read %s: the broker did not return it", name)
}

// checkAuthTimeout bounds CheckAuth: a broker that does not answer in time is
// an outage, for Write's retries, not a verdict on the credentials.
const checkAuthTimeout = 5 * time.Second

// CheckAuth connects to the bootstrap brokers as Write would, with the
// configured TLS and SASL, and returns a *kafkaclient.AuthError when a broker refuses
// those settings; nil when one accepts them, and also when none answers within
// a few seconds (an outage: Write waits for Kafka; a refusal is found then by
// Write as broker-wide failures, retried). Meant for start-up, so that wrong
// credentials stop the relay before it streams, instead of holding every event
// as a Kafka outage. Safe for concurrent use.
func (k *Admin) CheckAuth(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkAuthTimeout)
	defer cancel()
	err := k.Ping(ctx)
	if err == nil {
		return nil
	}
	return k.cfg.Refused(err)
}

// UnifiedTopic is topic as Kafka compares names for collisions: '.' and
// '_' may not both be used in topic names that are otherwise the same
// (metrics names would collide).
func UnifiedTopic(topic string) string { return strings.ReplaceAll(topic, ".", "_") }
