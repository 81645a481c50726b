package relay

import "time"

// SetRefillProgressEvery sets how often a refill logs its progress, until
// the returned func restores it.
func SetRefillProgressEvery(d time.Duration) (restore func()) {
	old := refillProgressEvery
	refillProgressEvery = d
	return func() { refillProgressEvery = old }
}
