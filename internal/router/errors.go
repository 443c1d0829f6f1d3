package router

import "github.com/faultrouter/faultrouter/internal/router/restore"

// ErrUnreadableState is returned by a restore that met a changelog record
// this build cannot read (restore.ErrUnreadableState).
var ErrUnreadableState = restore.ErrUnreadableState
