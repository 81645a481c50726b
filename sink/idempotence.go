package sink

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
)

// ErrIdempotenceNotAllowed is wrapped when the cluster refuses the
// relay's principal a producer id: it lacks the IdempotentWrite permission.
var ErrIdempotenceNotAllowed = errors.New("the Kafka principal may not write idempotently (CLUSTER_AUTHORIZATION_FAILED for InitProducerId): grant it IdempotentWrite on the cluster (Kafka before 3.0; from 3.0 WRITE on any topic implies it), or turn idempotence off")

// CheckIdempotence asks a broker for a producer id, as the first Write does,
// and returns nil when it hands one out, or an error saying why not (wrapping
// ErrIdempotenceNotAllowed when the principal lacks IdempotentWrite). It does
// not change the sink's producer. With idempotence off it returns nil at
// once. For `check`; safe for concurrent use.
func (k *Kafka) CheckIdempotence(ctx context.Context) error {
	if k.cfg.DisableIdempotence {
		return nil
	}
	cl, err := k.newFranzClient()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		if errors.Is(err, kerr.ClusterAuthorizationFailed) {
			return fmt.Errorf("init producer id: %w: %w", ErrIdempotenceNotAllowed, err)
		}
		return fmt.Errorf("init producer id: %w", err)
	}
	return nil
}
