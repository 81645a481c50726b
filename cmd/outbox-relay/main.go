// Command outbox-relay streams outbox-table inserts from the Postgres WAL to
// Kafka. See `outbox-relay help`.
package main

import "os"

func main() { os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr)) }
