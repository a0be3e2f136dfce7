package cli

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestNATSDurableNamedAfterTheHandler: without --durable, a named handler's
// consumer gets a durable of its own, so each handler receives every
// message; the default handler keeps the default durable, and --durable
// always wins.
func TestNATSDurableNamedAfterTheHandler(t *testing.T) {
	t.Setenv("CONSUMER_DURABLE", "")
	for _, c := range []struct {
		args    []string
		handler string
		want    string
	}{
		{nil, "", "pgrelay-consumer"},
		{nil, "default", "pgrelay-consumer"},
		{nil, "mail", "pgrelay-consumer-mail"},
		{nil, "read.model", "pgrelay-consumer-read_model"},
		{[]string{"--durable", "mine"}, "mail", "mine"},
	} {
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		side := bindNATSConsumer(fs).(*natsConsumer)
		require.NoError(t, fs.Parse(c.args))
		got := side.config(SubscriberOptions{BatchSize: 10, HandlerName: c.handler}).Durable
		require.Equal(t, c.want, got, "%v %q", c.args, c.handler)
	}
}

// TestKafkaGroupAndRabbitMQQueueNamedAfterTheHandler: the same for a Kafka
// consumer group and a RabbitMQ queue: a named handler without --kafka-group
// or --amqp-queue gets its own, so that two handlers never split the
// messages between them.
func TestKafkaGroupAndRabbitMQQueueNamedAfterTheHandler(t *testing.T) {
	t.Setenv("KAFKA_GROUP", "")
	t.Setenv("AMQP_QUEUE", "")
	for _, c := range []struct {
		args                 []string
		handler              string
		wantGroup, wantQueue string
	}{
		{nil, "", "pgrelay-consumer", "pgrelay"},
		{nil, "default", "pgrelay-consumer", "pgrelay"},
		{nil, "mail", "pgrelay-consumer-mail", "pgrelay-mail"},
		{[]string{"--kafka-group", "g", "--amqp-queue", "q"}, "mail", "g", "q"},
	} {
		opts := SubscriberOptions{BatchSize: 10, HandlerName: c.handler}
		fk := pflag.NewFlagSet("run", pflag.ContinueOnError)
		k := bindKafkaConsumer(fk).(kafkaConsumerSide)
		fr := pflag.NewFlagSet("run", pflag.ContinueOnError)
		r := bindRabbitMQConsumer(fr).(*rabbitMQConsumer)
		var kargs, rargs []string
		for i := 0; i < len(c.args); i += 2 {
			if c.args[i] == "--kafka-group" {
				kargs = append(kargs, c.args[i:i+2]...)
			} else {
				rargs = append(rargs, c.args[i:i+2]...)
			}
		}
		require.NoError(t, fk.Parse(kargs))
		require.NoError(t, fr.Parse(rargs))
		require.Equal(t, c.wantGroup, k.consumerConfig(opts).WithDefaults().Group, "%v %q", c.args, c.handler)
		require.Equal(t, c.wantQueue, r.config(opts).Queue, "%v %q", c.args, c.handler)
	}
}
