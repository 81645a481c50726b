package relay

// TEMPORARY: until retry.PositionKey and sink.(*Kafka).Outage land.

import (
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

func positionKey(lsn pglogrepl.LSN, n int) string { return fmt.Sprintf("lsn:%s:%d", lsn, n) }

func sinkOutage(s any) (time.Time, error) {
	if o, ok := s.(interface{ Outage() (time.Time, error) }); ok {
		return o.Outage()
	}
	return time.Time{}, nil
}
