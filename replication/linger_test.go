package replication

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// slowReader is a connection that always has data.
type slowReader struct{ at []time.Time }

func (r *slowReader) Read(p []byte) (int, error) {
	r.at = append(r.at, time.Now())
	return copy(p, "x"), nil
}

func TestLingerReaderWaitsOnce(t *testing.T) {
	src := &slowReader{}
	l := &lingerReader{r: src}
	buf := make([]byte, 1)
	l.Read(buf) // nothing asked: at once
	now := time.Now()
	l.lingerAfter(now, 40*time.Millisecond)
	l.Read(buf)
	l.Read(buf) // the wait is for one read only
	if got := src.at[1].Sub(now); got < 40*time.Millisecond {
		t.Errorf("read after lingerAfter(now, 40ms) came %s after now; want at least 40ms", got)
	}
	if got := src.at[2].Sub(src.at[1]); got >= 40*time.Millisecond {
		t.Errorf("the read after that waited %s; want no wait (linger is for the next read only)", got)
	}
	if n := l.reads.Load(); n != 3 {
		t.Errorf("reads = %d; want 3", n)
	}
	var none *lingerReader
	none.lingerAfter(now, time.Second) // no connection yet: a no-op, not a panic
}

// TestStreamReceiveLinger commits one-row transactions one after the other,
// faster than the linger, and reads them with and without it: with it, the
// stream reads them in groups (far fewer reads), and hands on every one, in
// order.
func TestStreamReceiveLinger(t *testing.T) {
	reads := map[time.Duration]int64{}
	for _, linger := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprint("linger ", linger), func(t *testing.T) {
			db := outboxDB(t)
			r := startStream(t, db, Config{ReceiveLinger: linger}, 0)
			db.exec(insertSQL(0, 1)) // the stream is up once this arrives
			first := r.txns(1)
			const n = 60
			done := make(chan error, 1)
			go func() {
				for i := 1; i <= n; i++ {
					if _, err := db.conn.Exec(context.Background(), insertSQL(i, i+1)).ReadAll(); err != nil {
						done <- err
						return
					}
					time.Sleep(3 * time.Millisecond)
				}
				done <- nil
			}()
			before := r.s.reader.Load().reads.Load()
			got := r.txns(n)
			if err := <-done; err != nil {
				t.Fatalf("insert: %v", err)
			}
			reads[linger] = r.s.reader.Load().reads.Load() - before
			all := append(first, got...)
			var bs []Batch
			for _, txn := range all {
				bs = append(bs, txn...)
			}
			if g, w := strings.Join(ids(bs), ","), strings.Join(seq(0, n+1), ","); g != w {
				t.Fatalf("ids = %s; want %s", g, w)
			}
			t.Logf("%d transactions, %d reads", n, reads[linger])
		})
	}
	if reads[50*time.Millisecond]*2 > reads[0] {
		t.Errorf("reads with a 50ms linger = %d, without = %d; want at most half", reads[50*time.Millisecond], reads[0])
	}
}
