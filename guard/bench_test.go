package guard_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pgrelay/pgrelay/guard"
	"github.com/pgrelay/pgrelay/internal/testdb"
)

// BenchmarkReserve measures one check (Reserve of a fresh key) per store:
//
//	go test -run '^$' -bench Reserve -benchtime 2000x ./guard/
func BenchmarkReserve(b *testing.B) {
	for _, name := range []string{"postgres", "redis"} {
		b.Run(name, func(b *testing.B) {
			var s guard.Store
			if name == "postgres" {
				s = guard.NewPostgresStore(testdb.New(b))
			} else {
				s = guard.NewRedisStore(redisClientTB(b), prefix())
			}
			g, err := guard.New(guard.Config{Store: s})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			b.ResetTimer()
			for i := range b.N {
				if _, err := g.Reserve(ctx, "bench:"+strconv.Itoa(i), time.Minute); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
