// Package worker is faultrouter's client for AI workers written in Go: the
// services that call models and act on the answers. A worker tells the
// router about every attempt of a task; the router decides what happens
// next, and this package brings the decision back.
//
// # The loop
//
// A worker needs three things, each built from one Config:
//
//   - a Reporter, to send the outcome of every attempt (success or failure)
//     to the ingress topic with Reporter.Report;
//   - a Retries, to take the retries the router publishes when they are due
//     (Retries.Next), each with the model to use (Retry.Model), the
//     validator's feedback for the next prompt (Retry.Feedback), and the
//     event of the next attempt ready to fill in (Retry.Next);
//   - optionally a ReviewOutcomes, to learn what a person decided about a
//     task sent to review (ReviewOutcomes.Await): approved (a retry follows
//     on the retry topic) or rejected (the task has ended; the decision holds
//     the end-user messages).
//
// The runnable Example shows the loop: a timed-out attempt reported, its
// retry taken one second later, the next attempt reported.
//
// # What to report
//
// One event.TaskEvent per attempt, successes included: the router sums each
// task's usage against its budget and closes the task on success. Give every
// attempt of one task the same TaskID and an increasing Attempt; derive the
// ID from the task's content, user and action with package taskid, so a
// resubmitted task is recognised as the same. Say where an attempt failed
// (Stage: NETWORK, PROTOCOL, MODEL or BUSINESS) and how (Status, Error with
// the HTTP status or validator code, Output with the model's refusal or
// confidence), and what it cost (Usage). A business write names its
// Operation, so that a write whose receipt was lost is held for
// reconciliation instead of being run twice. Report fills in EventID,
// OccurredAt and Source when they are empty; a field that is still invalid
// is an error naming it (an *event.FieldError inside), and nothing is sent.
//
// Do not retry on your own: turn off the retries of the model's SDK and of
// any validator loop. The router's retry budget is meant to be the only
// retry layer, and it retries only what a retry can help.
//
// # Delivery
//
// Report returns once every event is acknowledged; its producer is
// idempotent, so a send retried after a lost acknowledgement is written once.
// Records are Avro in the single-object encoding of package codec (the Avro
// specification's fingerprints, the bytes Java and Python workers write) and
// are keyed by task ID, hashed like the Java client (murmur2), so each lands
// on its task's partition.
//
// Retries and ReviewOutcomes read in a consumer group, at least once: a
// record is committed when Next is called again or on Close, so one that was
// being handled when the worker died is delivered again. Report the attempt
// with the same event ID and the router drops the duplicate. A new group
// starts at the beginning of its topic.
//
// # Configuration
//
// Config.ClientOpts reach the cluster (kgo.SeedBrokers at least, and SASL,
// TLS or a logger as the cluster needs); Config.TopicPrefix must be the
// router's --topic-prefix; Config.Source names the service in its events. A
// Config that cannot work is an error wrapping ErrConfig that names the
// field.
//
// Importing this package pulls in the records (package event), their codec
// and the topic names, never the router, its policy, breakers or store.
package worker
