package metrics

import (
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	_ "github.com/walcast/walcast/api/walcastv1" // registers the service NewAPI looks up
)

const testService = "walcast.api.v1.BroadcastService"

// discard is a ResponseWriter that keeps nothing, so that allocation counts
// are the wrapper's.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// grpcWebTrailers is a gRPC-Web trailers frame holding status.
func grpcWebTrailers(status string) []byte {
	payload := []byte("grpc-status: " + status + "\r\n")
	frame := make([]byte, 5, 5+len(payload))
	frame[0] = 0x80
	binary.BigEndian.PutUint32(frame[1:], uint32(len(payload)))
	return append(frame, payload...)
}

// TestAPIWrapCountsCodesOfEveryProtocol: the code of a call is read where
// its protocol puts it (Connect: the status and the error body; gRPC: the
// grpc-status trailer; gRPC-Web: the trailers frame), and a path that is
// not a method is not counted.
func TestAPIWrapCountsCodesOfEveryProtocol(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := NewAPI(reg, testService)
	if err != nil {
		t.Fatal(err)
	}
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Case") {
		case "connect-ok":
			_, _ = w.Write([]byte("\x08\x01"))
		case "connect-error":
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"code":"not_found","message":"no task 9"}`))
		case "grpc-error":
			w.Header().Set(http.TrailerPrefix+"Grpc-Status", "3")
			_, _ = w.Write([]byte("\x00\x00\x00\x00\x00"))
		case "grpc-web-error":
			_, _ = w.Write(grpcWebTrailers("9"))
		}
	}))
	for _, c := range []struct{ path, contentType, name string }{
		{"/" + testService + "/Broadcast", "application/proto", "connect-ok"},
		{"/" + testService + "/GetTask", "application/json", "connect-error"},
		{"/" + testService + "/GetTask", "application/grpc", "grpc-error"},
		{"/" + testService + "/ListLocks", "application/grpc-web+proto", "grpc-web-error"},
		{"/nothing/here", "application/proto", "connect-ok"},
	} {
		r := httptest.NewRequest(http.MethodPost, c.path, nil)
		r.Header.Set("Content-Type", c.contentType)
		r.Header.Set("X-Case", c.name)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	for _, c := range []struct {
		method, code string
		want         float64
	}{
		{"Broadcast", "ok", 1},
		{"GetTask", "not_found", 1},
		{"GetTask", "invalid_argument", 1},
		{"ListLocks", "failed_precondition", 1},
		{"ListLocks", "ok", 0},
	} {
		if got := testutil.ToFloat64(a.requests.WithLabelValues(testService+"/"+c.method, c.code)); got != c.want {
			t.Errorf("%s %s: %v calls, want %v", c.method, c.code, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(a.requests, "walcast_api_requests_total"); n < 5 {
		t.Errorf("%d request series, want the ok series of every method and the errors", n)
	}
}

// TestAPIWrapSuccessAllocatesOnlyItsRecorder: a call that succeeds costs
// the wrapper one allocation (its response-writer wrapper): no label
// lookup, no copy of the body.
func TestAPIWrapSuccessAllocatesOnlyItsRecorder(t *testing.T) {
	a, err := NewAPI(prometheus.NewRegistry(), testService)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 300)
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	r := httptest.NewRequest(http.MethodPost, "/"+testService+"/Broadcast", nil)
	r.Header.Set("Content-Type", "application/proto")
	w := &discard{h: http.Header{}}
	h.ServeHTTP(w, r)
	if got := testutil.ToFloat64(a.requests.WithLabelValues(testService+"/Broadcast", "ok")); got != 1 {
		t.Fatalf("%v calls counted, want 1", got)
	}
	if n := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, r) }); n > 1 {
		t.Fatalf("%v allocations per successful call, want at most 1", n)
	}
}
