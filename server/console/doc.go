// Package console is walcast's operator console (SPEC R9.9): server-rendered
// HTML pages that the coordinator serves at /ui/ on its API address.
//
// Pages: overview (cluster, role, leader and term, readiness, pchannels and
// lanes, streaming nodes as the leader knows them from their acks and, in
// this process, with their apply lag, replication, task counts, oldest live
// task, callback failures, early evictions), tasks (filters by
// state, type, age, "hanging", text search, paging by id cursor), one task
// (message, keys, targets with checkpoints and acks, callback attempts,
// outcome, idempotency window, trace link; retry and complete for admins),
// locks (holders and waiters with ages), keys (idempotency key lookup, and the remembered keys a page at a time),
// imports (from the application, if it has any) and replication.
//
// The pages are html/template (every string is escaped, and control
// characters are shown as \xNN escapes) plus one small script served from
// the binary: there is no JavaScript build step. Each page's live region
// updates through server-sent events (/ui/events): the server re-renders the
// region every Config.Interval and sends it when it changed. Without
// JavaScript the pages work and refresh themselves.
//
// # Access
//
// Config.Authorize identifies the caller and its role: reading needs
// RoleReader, the actions (retry a callback, complete a task) need RoleAdmin.
// Actions are POSTs carrying a CSRF token: an HMAC, under a per-process key,
// of a random per-browser cookie (SameSite=Strict, HttpOnly) and the
// caller's identity; a POST whose Origin (or Referer) names another host is
// refused too. Without an Authorize hook the console serves loopback callers
// only, as admins (LoopbackOnly), the standalone default.
//
// # Data
//
// The console reads the engine through package broadcast's public API
// (Tasks, Task, Locks, Lookup, Stats, Role, ReplicateConfig, RetryCallback,
// CompleteCallback) and everything else through the hooks of Config, so it
// depends on neither the server package nor any application.
package console
