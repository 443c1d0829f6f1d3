package console

// Webhooks is the owners' notification config.
type Webhooks struct{}
