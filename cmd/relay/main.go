// Command relay publishes committed pgrelay outbox rows to NATS JetStream.
//
//	relay run           relay until SIGTERM
//	relay migrate up    apply the database migrations
//
// Every flag can also be set through the environment variable named in its
// help text. Without a NATS URL the relay starts an embedded NATS server with
// JetStream, so a first run needs only PostgreSQL.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}
