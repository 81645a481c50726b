package relay

import "time"

// SetRefillProgressEvery sets how often a refill logs its progress, until
// the returned func restores it.
func SetRefillProgressEvery(d time.Duration) (restore func()) {
	old := refillProgressEvery
	refillProgressEvery = d
	return func() { refillProgressEvery = old }
}

// DrainFirstNext makes r's next term drain its WAL buffer before it streams,
// as a term that left buffering with events still buffered does.
func DrainFirstNext(r *Relay) { r.next = modeDrainFirst }
