package relay

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/broker/nats"
)

// The test binary re-executes itself as a relay process (childEnv=1) so that
// a test can SIGKILL a real relay at a precise point.
const childEnv = "PGRELAY_TEST_RELAY_CHILD"

// runChild runs a relay that, after its first publish is acknowledged and
// before it marks anything, prints "PUBLISHED" and blocks until it is killed.
// With CHILD_LEASE set, it is a plain relay with that lease, a heartbeat every
// CHILD_HEARTBEAT (default: a third of the lease) and the name CHILD_NODE_ID
// (default "child").
func runChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("CHILD_DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pub, err := nats.NewPublisher(ctx, nats.Config{
		URL: os.Getenv("CHILD_NATS_URL"), SubjectPrefix: os.Getenv("CHILD_PREFIX"), Stream: os.Getenv("CHILD_STREAM"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg := Config{
		Pool: pool, Publisher: pub, NodeID: "child", Lease: time.Second, HeartbeatInterval: 200 * time.Millisecond,
		hooks: hooks{afterPublish: func(int32, []int64) {
			fmt.Println("PUBLISHED")
			select {}
		}},
	}
	if lease := os.Getenv("CHILD_LEASE"); lease != "" {
		if cfg.Lease, err = time.ParseDuration(lease); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		cfg.HeartbeatInterval, cfg.hooks = cfg.Lease/3, hooks{}
		if hb := os.Getenv("CHILD_HEARTBEAT"); hb != "" {
			if cfg.HeartbeatInterval, err = time.ParseDuration(hb); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
		}
		if id := os.Getenv("CHILD_NODE_ID"); id != "" {
			cfg.NodeID = id
		}
	}
	r, err := newEngine(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	_ = r.run(ctx)
	return 0
}
