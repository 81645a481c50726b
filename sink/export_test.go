package sink

// KeyPartition exposes keyPartition to the external tests.
var KeyPartition = keyPartition
