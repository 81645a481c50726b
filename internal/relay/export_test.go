package relay

// DrainFirstNext makes r's next term drain its WAL buffer before it streams,
// as a term that left buffering with events still buffered does.
func DrainFirstNext(r *Relay) { r.next = modeDrainFirst }
