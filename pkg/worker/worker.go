package worker

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultrouter/faultrouter/pkg/topicspec"
)

// ErrConfig is returned by the constructors for a Config that cannot work;
// the message names the field.
var ErrConfig = errors.New("worker: bad config")

// Config says how a worker reaches the router's topics.
type Config struct {
	// ClientOpts are the franz-go options reaching the cluster: seed brokers,
	// SASL, TLS, a logger. Required (at least kgo.SeedBrokers).
	ClientOpts []kgo.Opt
	// TopicPrefix is the router's topic prefix (its --topic-prefix).
	// Default "".
	TopicPrefix string
	// Source is written into events that leave TaskEvent.Source empty: the
	// emitting service. Default "worker".
	Source string
}

// Validate returns an error naming the first field that cannot work.
func (c Config) Validate() error {
	if len(c.ClientOpts) == 0 {
		return fmt.Errorf("%w: ClientOpts is empty; give at least kgo.SeedBrokers", ErrConfig)
	}
	return nil
}

// topics returns the router's topic names under the config's prefix.
func (c Config) topics() (map[topicspec.Short]string, error) {
	set, err := topicspec.Load(c.TopicPrefix)
	if err != nil {
		return nil, fmt.Errorf("%w: TopicPrefix %q: %v", ErrConfig, c.TopicPrefix, err)
	}
	out := map[topicspec.Short]string{}
	for _, short := range topicspec.Shorts() {
		if out[short], err = set.Name(short); err != nil {
			return nil, err
		}
	}
	return out, nil
}
