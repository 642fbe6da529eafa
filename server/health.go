package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	clientv3 "go.etcd.io/etcd/client/v3"

	etcdcat "github.com/walcast/walcast/catalog/etcd"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Roles a coordinator reports in Readiness.
const (
	// RoleLeader: elected, recovered, serving.
	RoleLeader = "leader"
	// RoleRecovering: elected, its broadcaster still recovering.
	RoleRecovering = "recovering"
	// RoleStandby: another coordinator leads; this one redirects clients
	// to it and takes over when its lease expires.
	RoleStandby = "standby"
	// RoleElecting: no leader is known (an election is under way, or etcd
	// cannot be read).
	RoleElecting = "electing"
)

// Check is one readiness check: its name, whether it passed, and what it
// found.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Readiness is what /readyz reports (R9.10): a coordinator is ready when a
// leader is known, the catalog and the WAL answer, and — if it leads — its
// recovery finished. A standby whose backends answer is ready as a standby.
type Readiness struct {
	Ready bool `json:"ready"`
	// Role is RoleLeader, RoleRecovering, RoleStandby or RoleElecting.
	Role string `json:"role"`
	// Leader is the leader's advertised API address, "" if none is known.
	Leader string `json:"leader,omitempty"`
	// Self is this coordinator's advertised address.
	Self   string  `json:"self"`
	Checks []Check `json:"checks"`
}

// Reason joins the failed checks' details: why the coordinator is not
// ready ("" if it is).
func (r Readiness) Reason() string {
	var out []string
	for _, c := range r.Checks {
		if !c.OK {
			out = append(out, c.Name+": "+c.Detail)
		}
	}
	return strings.Join(out, "; ")
}

// DefaultReadyTimeout bounds each backend probe of a readiness check (they
// run at once): a killed or cut-off etcd or NATS makes /readyz answer "not
// ready", with its reasons, within it — inside the 1 s a probe of the
// shipped manifests waits.
const DefaultReadyTimeout = 700 * time.Millisecond

// prober computes a coordinator's readiness.
type prober struct {
	coord   *Coordinator
	client  *clientv3.Client
	wal     *wal.WAL
	pchan   message.PChannel // probed with WAL.End
	timeout time.Duration
	extra   func() []Check   // more checks (the data directory's storage), or nil
	members *etcdcat.Members // the etcd members' probes (cluster mode), or nil
}

// Ready probes the catalog (by reading who leads, a linearizable etcd read)
// and the WAL (the end of the first pchannel), each within the timeout.
func (p *prober) Ready(ctx context.Context) Readiness {
	r := Readiness{Self: p.coord.cfg.Advertise}
	// Both probes run at once, so a dead backend costs one timeout.
	walc := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, p.timeout)
		defer cancel()
		_, err := p.wal.End(wctx, p.pchan)
		walc <- err
	}()
	// A dial of the members runs beside the read, so that a failed read
	// can say why (a refused connection) without a second wait.
	dialc := make(chan error, 1)
	go func() { dialc <- dialAny(ctx, "etcd", p.client.Endpoints(), p.timeout) }()
	cctx, cancel := context.WithTimeout(ctx, p.timeout)
	leader, err := etcdcat.Leader(cctx, p.client, p.coord.electionPrefix())
	cancel()
	// The read is linearizable and requires a leader (cluster mode): it
	// is answered only through a member in touch with a quorum.
	var members string
	if p.members != nil {
		members = " (" + p.members.Summary() + ")"
	}
	if err != nil {
		// Why: a refused connection says more than the read's deadline.
		why := fmt.Sprintf("etcd does not answer within %v: %v", p.timeout, err)
		if derr := <-dialc; derr != nil {
			why = "etcd does not answer: " + derr.Error()
		}
		r.Checks = append(r.Checks, Check{Name: "catalog", Detail: why + members})
	} else {
		r.Checks = append(r.Checks, Check{Name: "catalog", OK: true, Detail: "etcd answers" + members})
	}
	if err := <-walc; err != nil {
		r.Checks = append(r.Checks, Check{Name: "wal", Detail: fmt.Sprintf("%s does not answer: %v", p.pchan, err)})
	} else {
		r.Checks = append(r.Checks, Check{Name: "wal", OK: true, Detail: "the WAL answers"})
	}
	_, leads := p.coord.leading()
	switch {
	case leads:
		r.Role, r.Leader = RoleLeader, r.Self
		r.Checks = append(r.Checks, Check{Name: "leader", OK: true, Detail: "this coordinator leads"},
			Check{Name: "recovery", OK: true, Detail: "finished"})
	case err == nil && leader == r.Self:
		r.Role, r.Leader = RoleRecovering, r.Self
		r.Checks = append(r.Checks, Check{Name: "leader", OK: true, Detail: "this coordinator won the election"},
			Check{Name: "recovery", Detail: "the broadcaster is still recovering its tasks"})
	case err == nil && leader != "":
		r.Role, r.Leader = RoleStandby, leader
		detail := "standby; the leader is at " + leader
		if why, at := p.coord.GaveUp(); why != "" {
			detail += fmt.Sprintf("; this coordinator gave up its leadership at %s: %s", at.UTC().Format(time.RFC3339), why)
		}
		r.Checks = append(r.Checks, Check{Name: "leader", OK: true, Detail: detail})
	default:
		r.Role = RoleElecting
		r.Checks = append(r.Checks, Check{Name: "leader", Detail: "no leader is known"})
	}
	if p.extra != nil {
		r.Checks = append(r.Checks, p.extra()...)
	}
	r.Ready = true
	for _, c := range r.Checks {
		r.Ready = r.Ready && c.OK
	}
	return r
}

// serveReadyz answers 200 when ready, 503 otherwise, with one line per
// check ("ok catalog: etcd answers", "FAIL wal: ..."), or the Readiness
// as JSON when the client accepts application/json.
func (p *prober) serveReadyz(w http.ResponseWriter, req *http.Request) {
	writeReadiness(w, req, p.Ready(req.Context()))
}

func writeReadiness(w http.ResponseWriter, req *http.Request, r Readiness) {
	code := http.StatusOK
	if !r.Ready {
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	if strings.Contains(req.Header.Get("Accept"), "application/json") {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = jsonEncode(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	if r.Ready {
		fmt.Fprintf(w, "ready: %s\n", r.Role)
	} else {
		fmt.Fprintf(w, "not ready: %s\n", r.Reason())
	}
	for _, c := range r.Checks {
		mark := "ok"
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "%s %s: %s\n", mark, c.Name, c.Detail)
	}
}

// serveHealthz answers 200 while the process serves HTTP at all.
func serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

// healthChecker implements the standard gRPC health service over the
// readiness probe: the whole server ("") is SERVING when ready (a standby
// too); the API services are SERVING only on the ready leader, so a load
// balancer checking them sends calls to the leader.
type healthChecker struct {
	p        *prober
	services map[string]bool
}

// Check implements grpchealth.Checker.
func (h *healthChecker) Check(ctx context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if req.Service != "" && !h.services[req.Service] {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", req.Service))
	}
	r := h.p.Ready(ctx)
	st := grpchealth.StatusNotServing
	if r.Ready && (req.Service == "" || r.Role == RoleLeader) {
		st = grpchealth.StatusServing
	}
	return &grpchealth.CheckResponse{Status: st}, nil
}

// serviceName returns the gRPC service a Connect handler path
// ("/walcast.api.v1.BroadcastService/") serves.
func serviceName(path string) string { return strings.Trim(path, "/") }

// mountIntrospection adds the gRPC health service and server reflection
// (v1 and v1alpha, for grpcurl, buf curl and Postman) for services, and
// /healthz and /readyz, to mux.
func mountIntrospection(mux *http.ServeMux, p *prober, services []string, opts ...connect.HandlerOption) {
	names := append([]string{grpchealth.HealthV1ServiceName}, services...)
	set := make(map[string]bool, len(names))
	for _, s := range names {
		set[s] = true
	}
	mux.Handle(grpchealth.NewHandler(&healthChecker{p: p, services: set}, opts...))
	reflector := grpcreflect.NewStaticReflector(append(names, grpcreflect.ReflectV1ServiceName, grpcreflect.ReflectV1AlphaServiceName)...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector, opts...))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector, opts...))
	mux.HandleFunc("/healthz", serveHealthz)
	mux.HandleFunc("/readyz", p.serveReadyz)
}

func jsonEncode(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
