package guard

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStore keeps reservations as Redis keys (prefix + key) whose value
// names the state and the holder's token and whose expiry is the lease.
// Reservations are as durable as the Redis server: a restart without
// persistence, or a failover to a replica that had not received the write,
// forgets them, and the effect can then be repeated.
type RedisStore struct {
	c      redis.UniversalClient
	prefix string
}

// NewRedisStore returns a store on c, with every key under prefix (for
// example "guard:").
func NewRedisStore(c redis.UniversalClient, prefix string) *RedisStore {
	return &RedisStore{c: c, prefix: prefix}
}

// Name implements Store.
func (s *RedisStore) Name() string { return "redis" }

// swap sets KEYS[1] to ARGV[2] with expiry ARGV[3] ms (or deletes it when
// ARGV[2] is empty) only when it holds ARGV[1].
var swap = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) return 1 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

// Reserve implements Store.
func (s *RedisStore) Reserve(ctx context.Context, key, token string, ttl time.Duration) (State, error) {
	k := s.prefix + key
	for range 3 {
		ok, err := s.c.SetNX(ctx, k, "r:"+token, ttl).Result()
		if err != nil {
			return 0, err
		}
		if ok {
			return Acquired, nil
		}
		v, err := s.c.Get(ctx, k).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue // expired between the two calls: try again
		case err != nil:
			return 0, err
		case strings.HasPrefix(v, "c:"):
			return Done, nil
		default:
			return InProgress, nil
		}
	}
	return InProgress, nil
}

func (s *RedisStore) swap(ctx context.Context, key, from, to string, ttl time.Duration) error {
	n, err := swap.Run(ctx, s.c, []string{s.prefix + key}, from, to, max(ttl.Milliseconds(), 1)).Int()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrLeaseLost
	}
	return nil
}

// Confirm implements Store. Once the lease expired the key is gone from
// Redis, so a late Confirm returns ErrLeaseLost.
func (s *RedisStore) Confirm(ctx context.Context, key, token string, keep time.Duration) error {
	return s.swap(ctx, key, "r:"+token, "c:"+token, keep)
}

// Extend implements Store.
func (s *RedisStore) Extend(ctx context.Context, key, token string, ttl time.Duration) error {
	return s.swap(ctx, key, "r:"+token, "r:"+token, ttl)
}

// Release implements Store.
func (s *RedisStore) Release(ctx context.Context, key, token string) error {
	return s.swap(ctx, key, "r:"+token, "", 0)
}

// Stats implements Store: the live keys under the prefix, counted with SCAN
// (a walk of the keyspace, so metrics scrapes cost O(keys)); storage bytes
// are not cheap to know in Redis and are reported unknown.
func (s *RedisStore) Stats(ctx context.Context) (Stats, error) {
	var n int64
	iter := s.c.Scan(ctx, 0, s.prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	if err := iter.Err(); err != nil {
		return Stats{}, err
	}
	return Stats{ActiveKeys: n, StorageBytes: -1}, nil
}
