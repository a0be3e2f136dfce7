package kafka

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgrelay/pgrelay/internal/setting"
)

// checkRetention refuses topics that keep records longer than the inbox's
// dedup window. A consumer group that starts over (a new group, or offsets
// expired after the group sat idle) reads from the earliest record; a record
// older than the dedup window is no longer recognised by the inbox and its
// side effect would be applied twice.
func checkRetention(ctx context.Context, cl *kgo.Client, cfg Config) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	topics, err := consumedTopics(ctx, cl, cfg)
	if err != nil {
		return err
	}
	if len(topics) == 0 {
		return nil
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range topics {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, t
		r.ConfigNames = []string{"retention.ms"}
		req.Resources = append(req.Resources, r)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka: reading the topics' retention.ms: %w", err)
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("kafka: reading retention.ms of topic %s: %w", r.ResourceName, err)
		}
		for _, c := range r.Configs {
			if c.Name != "retention.ms" || c.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				continue
			}
			keep := time.Duration(ms) * time.Millisecond
			if ms < 0 || keep > cfg.DedupWindow {
				what := "forever"
				if ms >= 0 {
					what = "for " + keep.String()
				}
				return setting.Errorf("kafka", "kafka.Config", "DedupWindow", "topic %s keeps records %s (retention.ms), longer than the inbox's dedup window {} %s: "+
					"a consumer group starting over would replay events the inbox no longer remembers and apply them twice; "+
					"lower the topic's retention.ms or set {AllowReplayBeyondDedupWindow}", r.ResourceName, what, cfg.DedupWindow)
			}
		}
	}
	return nil
}

// consumedTopics returns the Kafka topics the subscriber consumes now.
func consumedTopics(ctx context.Context, cl *kgo.Client, cfg Config) ([]string, error) {
	if len(cfg.Topics) > 0 {
		out := make([]string, len(cfg.Topics))
		for i, t := range cfg.Topics {
			out[i] = cfg.KafkaTopic(t)
		}
		return out, nil
	}
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("kafka: listing topics: %w", err)
	}
	var out []string
	for _, t := range resp.Topics {
		if t.Topic != nil && strings.HasPrefix(*t.Topic, cfg.TopicPrefix+".") {
			out = append(out, *t.Topic)
		}
	}
	return out, nil
}
