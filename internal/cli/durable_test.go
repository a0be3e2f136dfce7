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
