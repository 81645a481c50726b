package relay

// TEMPORARY: until retry.PositionKey lands.

import (
	"fmt"

	"github.com/jackc/pglogrepl"
)

func positionKey(lsn pglogrepl.LSN, n int) string { return fmt.Sprintf("lsn:%s:%d", lsn, n) }
