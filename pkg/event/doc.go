// Package event defines faultrouter's records as Go values: the TaskEvent a
// worker reports for every attempt, the Decision the router takes for it, the
// Routed record written to the retry, review, audit and dead-letter topics,
// the BreakerEvent of the alert topic and the ReviewDecision a person writes.
//
// The JSON form of each type uses the Avro field names, so that `faultrouter
// produce` and `faultrouter tail` speak the same shape as the wire. A field that
// may be null in Avro is a pointer or an empty string here and is omitted from
// JSON when unset.
package event
