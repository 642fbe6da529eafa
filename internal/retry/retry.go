// Package retry is the one retry helper of walcast: an exponential schedule
// without jitter (Policy) and Do, which runs an operation until it succeeds,
// fails permanently or its context ends, built on cenkalti/backoff. Every
// retry of one operation uses Do (node applies, acks and state saves, the
// replicator's appends, the NATS adapter's stream setup and in-flight
// dedup); the loops that restart a long-running activity after it broke
// (a node's WAL reader, a replicator's pchannel run, a coordinator's
// campaign) take Policy's schedule and reset it after progress; the
// broadcast engine's decision core uses the schedule with virtual time
// instead of sleeping.
//
// What a failure means — retry it, give up, or step down — is the caller's
// classification (for catalog and WAL writes: the durable-write policy of
// broadcast/internal/engine); Do only needs to know which errors are permanent.
package retry

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is an exponential retry schedule: Initial, then ×Multiplier per
// failure, capped at Max. The zero Policy means the SPEC's defaults (R4.3,
// R5.2): 10 ms, ×2, 10 s.
type Policy struct {
	Initial    time.Duration
	Multiplier float64
	Max        time.Duration
}

// WithDefaults fills zero fields with the defaults.
func (p Policy) WithDefaults() Policy {
	if p.Initial == 0 {
		p.Initial = 10 * time.Millisecond
	}
	if p.Multiplier == 0 {
		p.Multiplier = 2
	}
	if p.Max == 0 {
		p.Max = 10 * time.Second
	}
	return p
}

// Schedule returns a fresh schedule that never gives up: NextBackOff gives
// the wait before each next attempt, Reset starts it over. It has no jitter,
// so the same failures give the same waits (the simulator replays them).
func (p Policy) Schedule() *backoff.ExponentialBackOff {
	p = p.WithDefaults()
	e := &backoff.ExponentialBackOff{InitialInterval: p.Initial, Multiplier: p.Multiplier, MaxInterval: p.Max}
	e.Reset()
	return e
}

// Permanent marks err as not worth retrying: Do returns it (unwrapped) at
// once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return backoff.Permanent(err)
}

// Option adjusts one Do call.
type Option func(*options)

type options struct {
	notify   func(err error, attempt int, next time.Duration)
	maxTries uint
}

// Notify calls fn after each failed attempt that will be retried, with the
// attempt's number (from 1) and the wait before the next.
func Notify(fn func(err error, attempt int, next time.Duration)) Option {
	return func(o *options) { o.notify = fn }
}

// MaxTries gives up after n attempts (0: never).
func MaxTries(n uint) Option { return func(o *options) { o.maxTries = n } }

// Do runs op until it returns nil, a Permanent error, or ctx ends, waiting
// the policy's schedule between attempts. It returns nil, the permanent
// error, or — when ctx ended — the last attempt's error joined with ctx's,
// so that errors.Is finds both.
func Do(ctx context.Context, p Policy, op func(ctx context.Context) error, opts ...Option) error {
	// The first attempt runs before anything is set up: almost every
	// operation succeeds at once (a node's apply and ack of every copy),
	// and the schedule, options and closures of the retry loop cost about
	// ten allocations per call that only a failure needs.
	err := op(ctx)
	if err == nil {
		return nil
	}
	return retryAfter(ctx, p, op, err, opts)
}

// retryAfter is Do after a first attempt that failed with first.
func retryAfter(ctx context.Context, p Policy, op func(ctx context.Context) error, first error, opts []Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	attempt := 0
	var last error
	bopts := []backoff.RetryOption{
		backoff.WithBackOff(p.Schedule()),
		backoff.WithMaxElapsedTime(0),
		backoff.WithNotify(func(err error, next time.Duration) {
			if o.notify != nil {
				o.notify(err, attempt, next)
			}
		}),
	}
	if o.maxTries > 0 {
		bopts = append(bopts, backoff.WithMaxTries(o.maxTries))
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempt++
		err := first // the attempt Do made
		if attempt > 1 {
			err = op(ctx)
		}
		if err != nil {
			last = err
		}
		return struct{}{}, err
	}, bopts...)
	if err != nil && ctx.Err() != nil && last != nil && !errors.Is(err, last) {
		return errors.Join(last, err)
	}
	return err
}
