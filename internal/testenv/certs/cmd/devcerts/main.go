// Command devcerts makes a directory hold the dev servers' TLS files (package certs):
//
//	go run ./internal/testenv/certs/cmd/devcerts DIR
//
// It changes nothing when the files there are valid, and prints "generated DIR" when
// it wrote a new set (scripts/dev.sh then installs them and reloads the servers).
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv/certs"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: devcerts DIR")
		os.Exit(2)
	}
	wrote, err := certs.Ensure(os.Args[1], time.Now())
	if err != nil {
		fmt.Fprintln(os.Stderr, "devcerts:", err)
		os.Exit(1)
	}
	if wrote {
		fmt.Println("generated", os.Args[1])
	}
}
