package router

import "errors"

// ErrUnreadableState is returned by a restore that met a changelog record
// this build cannot read: a state written by a build outside its schema
// window, or bytes that are not a state. The restore of the partition stops
// there, rather than skip the record and route on with the state before it
// (or none): that would republish retries, forget pending ones, and let
// dedup sets and held writes lapse. The error names the record (topic,
// partition, offset, task) and the writer schema's fingerprint.
var ErrUnreadableState = errors.New("router: changelog record this build cannot read")
