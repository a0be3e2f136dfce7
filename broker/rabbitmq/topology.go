package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/pgrelay/pgrelay/internal/setting"
)

// dial opens a connection named name (shown in the management UI).
func dial(cfg Config, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(cfg.URL, amqp.Config{
		Heartbeat:  cfg.Heartbeat,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(cfg.DialTimeout),
		Properties: props,
	})
	if err != nil {
		return nil, fmt.Errorf("connect to RabbitMQ at %s: %w", RedactURL(cfg.URL), err)
	}
	return conn, nil
}

// openChannel dials a connection named name, declares the topology (the
// subscriber's queue too when subscriber is set) and opens a channel, for a
// publisher's or a subscriber's (re)connection. On an error nothing stays
// open.
func openChannel(ctx context.Context, cfg Config, name string, subscriber bool, log *slog.Logger) (*amqp.Connection, *amqp.Channel, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	conn, err := dial(cfg, name)
	if err != nil {
		return nil, nil, err
	}
	if err := declareTopology(conn, cfg, subscriber, log); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("open a channel: %w", err)
	}
	return conn, ch, nil
}

// supportsQuorum reports whether the server announces a version with quorum
// queues (3.8.0 or later). An unknown version counts as one without.
func supportsQuorum(conn *amqp.Connection) bool {
	v, _ := conn.Properties["version"].(string)
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 3 || major == 3 && minor >= 8
}

// isAMQPCode reports whether err is a server error with the AMQP reply code.
func isAMQPCode(err error, code int) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == code
}

// declareExchange declares the durable topic exchange, or with SkipDeclare
// checks that it exists. It may close ch on failure.
func declareExchange(ch *amqp.Channel, cfg Config) error {
	var err error
	if cfg.SkipDeclare {
		err = ch.ExchangeDeclarePassive(cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	} else {
		err = ch.ExchangeDeclare(cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	}
	switch {
	case err == nil:
		return nil
	case isAMQPCode(err, amqp.NotFound):
		return setting.Errorf("", "rabbitmq.Config", "Exchange", "exchange %q ({}) does not exist and declaring is off ({SkipDeclare}): %w", cfg.Exchange, err)
	case isAMQPCode(err, amqp.PreconditionFailed):
		return setting.Errorf("", "rabbitmq.Config", "Exchange", "exchange %q ({}) exists with other settings than a durable topic exchange: %w", cfg.Exchange, err)
	}
	return fmt.Errorf("declare exchange %q: %w", cfg.Exchange, err)
}

// declareQueue makes sure the queue exists and is bound: a queue that exists
// is used as it is (whatever its type); a missing one is declared with the
// configured type. With SkipDeclare it only checks that the queue exists. It
// returns the type it declared, or "existing". It opens its own channels (a
// failed passive declaration closes the channel it ran on).
func declareQueue(conn *amqp.Connection, cfg Config, log *slog.Logger) (string, error) {
	ch, err := conn.Channel()
	if err != nil {
		return "", fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	_, err = ch.QueueDeclarePassive(cfg.Queue, true, false, false, false, nil)
	declared := "existing"
	switch {
	case err == nil:
	case isAMQPCode(err, amqp.NotFound) && cfg.SkipDeclare:
		return "", setting.Errorf("", "rabbitmq.Config", "Queue", "queue %q ({}) does not exist and declaring is off ({SkipDeclare}): %w", cfg.Queue, err)
	case isAMQPCode(err, amqp.NotFound):
		if ch, err = conn.Channel(); err != nil {
			return "", fmt.Errorf("open channel: %w", err)
		}
		defer func() { _ = ch.Close() }()
		declared = cfg.QueueType
		if declared == QueueTypeAuto {
			declared = QueueTypeClassic
			if supportsQuorum(conn) {
				declared = QueueTypeQuorum
			}
		}
		var args amqp.Table
		if declared == QueueTypeQuorum {
			args = amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
		}
		if _, err := ch.QueueDeclare(cfg.Queue, true, false, false, false, args); err != nil {
			if isAMQPCode(err, amqp.PreconditionFailed) {
				return "", setting.Errorf("", "rabbitmq.Config", "Queue", "queue %q ({}) was declared meanwhile with other settings: %w", cfg.Queue, err)
			}
			return "", fmt.Errorf("declare %s queue %q: %w", declared, cfg.Queue, err)
		}
		log.Info("declared queue", slog.String("queue", cfg.Queue), slog.String("type", declared))
	default:
		return "", fmt.Errorf("inspect queue %q: %w", cfg.Queue, err)
	}
	if cfg.SkipDeclare {
		return declared, nil
	}
	if err := ch.QueueBind(cfg.Queue, cfg.BindingKey, cfg.Exchange, false, nil); err != nil {
		return "", fmt.Errorf("bind queue %q to exchange %q with key %q: %w", cfg.Queue, cfg.Exchange, cfg.BindingKey, err)
	}
	return declared, nil
}

// declareTopology declares the exchange, the queue and the binding on conn.
// With SkipDeclare it only checks what the side needs: the publisher
// (subscriber false) the exchange, the subscriber the queue.
func declareTopology(conn *amqp.Connection, cfg Config, subscriber bool, log *slog.Logger) error {
	if !cfg.SkipDeclare || !subscriber {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		err = declareExchange(ch, cfg)
		_ = ch.Close()
		if err != nil {
			return err
		}
	}
	if cfg.SkipDeclare && !subscriber {
		return nil
	}
	_, err := declareQueue(conn, cfg, log)
	return err
}
