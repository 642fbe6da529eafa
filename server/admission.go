package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
)

// RetryAfterHeader carries, on a call refused by admission, how long to
// wait before retrying, in seconds (as HTTP's Retry-After); the error's
// google.rpc.RetryInfo detail carries it too.
const RetryAfterHeader = "Retry-After"

// admission bounds the API calls a coordinator serves at once (R9: overload
// is bounded): at most maxInFlight run, at most maxQueued wait for a slot,
// each at most queueTimeout; a call beyond that is refused at once with
// ResourceExhausted (QUOTA_EXCEEDED) and a retry hint, before it costs
// anything more (it is not authenticated, decoded or logged). Node acks
// and the health and reflection services are never refused: acks finish
// work already admitted.
type admission struct {
	slots        chan struct{}
	maxQueued    int64
	queueTimeout time.Duration
	retryAfter   time.Duration
	errw         *connect.ErrorWriter

	queued   atomic.Int64
	inFlight atomic.Int64
	refused  *prometheus.CounterVec
}

// newAdmission returns the admission of cfg's api.max_in_flight,
// api.max_queued, api.queue_timeout and api.retry_after; nil when
// max_in_flight is 0 (off).
func newAdmission(cfg Config, reg prometheus.Registerer) (*admission, error) {
	if cfg.API.MaxInFlight == 0 {
		return nil, nil
	}
	a := &admission{
		slots:        make(chan struct{}, cfg.API.MaxInFlight),
		maxQueued:    int64(cfg.API.MaxQueued),
		queueTimeout: cfg.API.QueueTimeout.D(),
		retryAfter:   cfg.API.RetryAfter.D(),
		errw:         connect.NewErrorWriter(),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walcast_api_refused_total",
			Help: "API calls refused by admission (api.max_in_flight, api.max_queued): queue full, or waited api.queue_timeout."}, []string{"reason"}),
	}
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "walcast_api_in_flight",
		Help: "API calls being served now (at most api.max_in_flight)."}, func() float64 { return float64(a.inFlight.Load()) })
	queued := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "walcast_api_queued",
		Help: "API calls waiting for a slot (at most api.max_queued)."}, func() float64 { return float64(a.queued.Load()) })
	for _, c := range []prometheus.Collector{a.refused, inflight, queued} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	a.refused.WithLabelValues("queue_full")
	a.refused.WithLabelValues("queue_timeout")
	return a, nil
}

// exempt says whether a request bypasses admission.
func exempt(r *http.Request) bool {
	switch {
	case r.URL.Path == walcastv1connect.BroadcastServiceAckProcedure:
		return true
	case !strings.HasPrefix(r.URL.Path, "/walcast.api."):
		// Health, reflection, /readyz, the console's pages: cheap, or
		// needed to see the overload.
		return true
	}
	return false
}

// wrap admits h's calls.
func (a *admission) wrap(h http.Handler) http.Handler {
	if a == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if exempt(r) {
			h.ServeHTTP(w, r)
			return
		}
		select {
		case a.slots <- struct{}{}:
		default:
			if !a.wait(w, r) {
				return
			}
		}
		a.inFlight.Add(1)
		defer func() {
			a.inFlight.Add(-1)
			<-a.slots
		}()
		h.ServeHTTP(w, r)
	})
}

// wait queues r for a slot; it answers r and returns false when it is
// refused.
func (a *admission) wait(w http.ResponseWriter, r *http.Request) bool {
	if a.queued.Add(1) > a.maxQueued {
		a.queued.Add(-1)
		a.refuse(w, r, "queue_full", fmt.Sprintf("the coordinator serves %d calls and %d wait (api.max_in_flight, api.max_queued)", cap(a.slots), a.maxQueued))
		return false
	}
	defer a.queued.Add(-1)
	t := time.NewTimer(a.queueTimeout)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return true
	case <-t.C:
		a.refuse(w, r, "queue_timeout", fmt.Sprintf("no call slot freed within api.queue_timeout (%v): the coordinator is overloaded", a.queueTimeout))
		return false
	case <-r.Context().Done():
		a.errw.Write(w, r, connect.NewError(connect.CodeCanceled, r.Context().Err()))
		return false
	}
}

func (a *admission) refuse(w http.ResponseWriter, r *http.Request, reason, why string) {
	a.refused.WithLabelValues(reason).Inc()
	ce := connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("%w: %s; nothing was done: retry after %v with the same idempotency key", app.ErrQuotaExceeded, why, a.retryAfter))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: ReasonQuotaExceeded, Domain: ErrorDomain}); err == nil {
		ce.AddDetail(d)
	}
	if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(a.retryAfter)}); err == nil {
		ce.AddDetail(d)
	}
	secs := int((a.retryAfter + time.Second - 1) / time.Second)
	w.Header().Set(RetryAfterHeader, strconv.Itoa(secs))
	if err := a.errw.Write(w, r, ce); err != nil && !errors.Is(err, context.Canceled) {
		http.Error(w, ce.Error(), http.StatusTooManyRequests)
	}
}
