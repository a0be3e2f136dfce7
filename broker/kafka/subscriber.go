package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay/broker"
	"github.com/pgrelay/pgrelay/internal/logbridge"
)

// Subscriber consumes the pgrelay topics as a member of a consumer group.
//
// Offsets are committed only for what the caller acknowledged: Delivery.Ack
// marks a record, and a partition's committed offset advances over the
// contiguous prefix of acknowledged records only (a record acknowledged
// before an earlier one waits for it). Commits are made in the background
// every CommitInterval, when a partition is revoked and on Close. A partition
// revoked in a rebalance (another member joined, this one is leaving) takes
// its unacknowledged records to its new owner, which receives them again; an
// acknowledgement that arrives after the revocation commits nothing, and the
// inbox absorbs the redelivery by event id.
//
// A record the caller never acknowledges while it runs (the consumer leaves
// one unacknowledged only when the database refuses it even as a dead
// letter) holds its partition's committed offset: the records after it are
// acknowledged but not committed, and a rebalance or restart delivers it and
// all of them again. Once it has been unacknowledged for a minute with later
// records of its partition acknowledged, the subscriber logs it at warn,
// once per record, naming the partition and offset.
type Subscriber struct {
	cfg Config
	cl  *kgo.Client
	log *slog.Logger
	// heldAfter is how long a partition's first unacknowledged record may
	// hold acknowledged records behind it before it is logged.
	heldAfter time.Duration

	mu     sync.Mutex
	parts  map[topicPartition]*partition
	closed bool

	stop      chan struct{}
	committer sync.WaitGroup
	closeOnce sync.Once
}

var _ broker.Subscriber = (*Subscriber)(nil)

type topicPartition struct {
	topic     string
	partition int32
}

// partition tracks one assigned partition's delivered records. It is
// replaced when the partition is revoked and assigned again.
type partition struct {
	revoked   bool
	pending   []*pendingRecord // delivered, not yet in the acknowledged prefix, in offset order
	ackedNext int64            // offset after the acknowledged prefix; -1 before the first
	epoch     int32            // leader epoch of the prefix's last record
	committed int64            // last committed offset; -1 before the first commit
	reported  int64            // offset of the holding record last logged; -1: none
}

type pendingRecord struct {
	offset int64
	epoch  int32
	acked  bool
	at     time.Time // when Fetch returned it
}

// heldAfter is how long a partition's first unacknowledged record may hold
// acknowledged records behind it before the subscriber logs it.
const heldAfter = time.Minute

// NewSubscriber validates cfg (after WithDefaults), joins the consumer group
// cfg.Group on the pgrelay topics (cfg.Topics, or every "<TopicPrefix>.*"
// topic) and checks that a broker answers. A new group starts from the
// earliest records.
func NewSubscriber(ctx context.Context, cfg Config) (*Subscriber, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg, log: logbridge.Or(cfg.Logger).With(slog.String("logger", "kafka")), heldAfter: heldAfter, parts: map[topicPartition]*partition{},
		stop: make(chan struct{})}
	opts := append(commonOpts(cfg, s.log),
		kgo.ConsumerGroup(cfg.Group),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
	)
	if len(cfg.Topics) > 0 {
		topics := make([]string, len(cfg.Topics))
		for i, t := range cfg.Topics {
			topics[i] = cfg.KafkaTopic(t)
		}
		opts = append(opts, kgo.ConsumeTopics(topics...))
	} else {
		opts = append(opts, kgo.ConsumeRegex(), kgo.ConsumeTopics("^"+regexp.QuoteMeta(cfg.TopicPrefix)+`\.`))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: consumer: %w", err)
	}
	if err := ping(ctx, cl, cfg); err != nil {
		cl.Close()
		return nil, err
	}
	if cfg.DedupWindow > 0 && !cfg.AllowReplayBeyondDedupWindow {
		if err := checkRetention(ctx, cl, cfg); err != nil {
			cl.Close()
			return nil, err
		}
	}
	s.cl = cl
	s.committer.Go(s.commitLoop)
	return s, nil
}

// Client returns the underlying franz-go client.
func (s *Subscriber) Client() *kgo.Client { return s.cl }

// Ping reports whether a broker answers (a readiness check).
func (s *Subscriber) Ping(ctx context.Context) error { return s.cl.Ping(ctx) }

// Fetch implements broker.Subscriber: it waits at most maxWait for records and
// returns up to max of them, in partition order, each decoded. A record
// without a usable event id gets the stand-in id FallbackEventID(topic,
// partition, offset). Fetch acknowledges nothing.
func (s *Subscriber) Fetch(ctx context.Context, n int, maxWait time.Duration) ([]broker.Delivery, error) {
	if n <= 0 {
		n = 1
	}
	pctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	fs := s.cl.PollRecords(pctx, n)
	// Rebalances wait until the records are registered below, so that a
	// revocation always finds them.
	defer s.cl.AllowRebalance()
	if fs.IsClientClosed() {
		return nil, errors.New("kafka: subscriber closed")
	}
	var errs []error
	for _, fe := range fs.Errors() {
		if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
			continue
		}
		errs = append(errs, fmt.Errorf("kafka: fetch %s/%d: %w", fe.Topic, fe.Partition, fe.Err))
	}
	recs := fs.Records()
	if len(recs) == 0 {
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, nil
	}
	for _, err := range errs {
		s.log.Warn("fetch error next to records", slog.Any("error", err))
	}

	out := make([]broker.Delivery, len(recs))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("kafka: subscriber closed")
	}
	now := time.Now()
	for i, r := range recs {
		tp := topicPartition{r.Topic, r.Partition}
		p := s.parts[tp]
		if p == nil {
			p = &partition{ackedNext: -1, committed: -1, reported: -1}
			s.parts[tp] = p
		}
		pr := &pendingRecord{offset: r.Offset, epoch: r.LeaderEpoch, at: now}
		p.pending = append(p.pending, pr)
		d := decodeRecord(s.cfg.TopicPrefix, r, broker.DecodeOptions{MaxPayloadBytes: s.cfg.MaxPayloadBytes})
		d.Ack = func(context.Context) error { return s.ack(p, pr) }
		d.InProgress = func(context.Context) error { return nil }
		// A record read again after a restart carries no sign of it:
		// FirstDelivery stays false.
		out[i] = d
	}
	return out, nil
}

// ack marks a record acknowledged and advances its partition's prefix.
func (s *Subscriber) ack(p *partition, pr *pendingRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.revoked {
		// The partition moved (or this subscriber closed): its new owner
		// receives the record again and the inbox absorbs it.
		return nil
	}
	pr.acked = true
	for len(p.pending) > 0 && p.pending[0].acked {
		p.ackedNext = p.pending[0].offset + 1
		p.epoch = p.pending[0].epoch
		p.pending[0] = nil
		p.pending = p.pending[1:]
	}
	return nil
}

// commitLoop commits the acknowledged prefixes every CommitInterval until
// Close.
func (s *Subscriber) commitLoop() {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := s.commit(ctx, nil); err != nil {
				s.log.Warn("commit failed; retried at the next interval", slog.Any("error", err))
			}
			cancel()
			s.reportHeld(time.Now())
		}
	}
}

// heldRecord is a partition's first unacknowledged record that holds
// acknowledged records behind it.
type heldRecord struct {
	tp            topicPartition
	offset        int64
	since         time.Time
	ackedBehind   int
	committedNext int64
}

// reportHeld logs, once per record, every partition whose first
// unacknowledged record has held acknowledged records behind it for
// heldAfter: its committed offset cannot move past it until it is
// acknowledged, or the partition is revoked or the subscriber closed (then
// it and every record after it are delivered again).
func (s *Subscriber) reportHeld(now time.Time) {
	var held []heldRecord
	s.mu.Lock()
	for tp, p := range s.parts {
		if p.revoked || len(p.pending) < 2 || p.pending[0].acked || p.pending[0].offset == p.reported ||
			now.Sub(p.pending[0].at) < s.heldAfter {
			continue
		}
		n := 0
		for _, pr := range p.pending[1:] {
			if pr.acked {
				n++
			}
		}
		if n == 0 {
			continue // nothing acknowledged waits behind it (yet)
		}
		p.reported = p.pending[0].offset
		held = append(held, heldRecord{tp: tp, offset: p.pending[0].offset, since: p.pending[0].at, ackedBehind: n,
			committedNext: p.committed})
	}
	s.mu.Unlock()
	for _, h := range held {
		s.log.Warn("a record left unacknowledged holds its partition's committed offset: the records acknowledged after it are not committed, "+
			"and a rebalance or restart delivers it and all of them again (the inbox absorbs those already stored)",
			slog.String("topic", h.tp.topic), slog.Any("partition", h.tp.partition), slog.Int64("offset", h.offset),
			slog.Duration("unacknowledged_for", now.Sub(h.since).Round(time.Millisecond)),
			slog.Int("acknowledged_after_it", h.ackedBehind), slog.Int64("committed_offset", h.committedNext))
	}
}

// commit commits the acknowledged prefix of every partition (or only of
// those in only) that advanced since its last commit.
func (s *Subscriber) commit(ctx context.Context, only map[topicPartition]bool) error {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	sent := map[topicPartition]*partition{}
	s.mu.Lock()
	for tp, p := range s.parts {
		if p.revoked || p.ackedNext <= p.committed || (only != nil && !only[tp]) {
			continue
		}
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: p.epoch, Offset: p.ackedNext}
		sent[tp] = p
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return nil
	}
	var cerr error
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range resp.Topics {
			for _, rp := range t.Partitions {
				tp := topicPartition{t.Topic, rp.Partition}
				if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
					cerr = errors.Join(cerr, fmt.Errorf("commit %s/%d: %w", tp.topic, tp.partition, err))
					continue
				}
				if p := sent[tp]; p != nil {
					p.committed = max(p.committed, offsets[tp.topic][tp.partition].Offset)
				}
			}
		}
	})
	return cerr
}

// onRevoked commits the revoked partitions' acknowledged prefixes and drops
// their tracking: their unacknowledged records go to the next owner.
func (s *Subscriber) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	set := toSet(revoked)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.commit(cctx, set); err != nil {
		s.log.Warn("commit on revocation failed; the next owner receives those records again", slog.Any("error", err))
	}
	s.drop(set)
}

// onLost drops the lost partitions' tracking without committing (the group
// no longer accepts this member's commits).
func (s *Subscriber) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.drop(toSet(lost))
}

func (s *Subscriber) drop(set map[topicPartition]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for tp := range set {
		if p := s.parts[tp]; p != nil {
			p.revoked = true
			delete(s.parts, tp)
		}
	}
}

func toSet(m map[string][]int32) map[topicPartition]bool {
	set := map[topicPartition]bool{}
	for t, ps := range m {
		for _, p := range ps {
			set[topicPartition{t, p}] = true
		}
	}
	return set
}

// Close stops the background commits, commits the acknowledged prefixes,
// leaves the group and closes the client. Unacknowledged records are
// delivered again to the group's next owner of their partition.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.committer.Wait()
		// Leaving the group revokes every partition: onRevoked commits.
		s.cl.CloseAllowingRebalance()
		s.mu.Lock()
		s.closed = true
		for tp, p := range s.parts {
			p.revoked = true
			delete(s.parts, tp)
		}
		s.mu.Unlock()
	})
	return nil
}
