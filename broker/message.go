package broker

import "github.com/pgrelay/pgrelay/internal/event"

// Message is one event to publish.
type Message = event.Message
