package metrics

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// API counts the RPCs of the API handlers it wraps, by procedure and status
// code, for every protocol the server speaks (Connect, gRPC, gRPC-Web):
//
//	walcast_api_requests_total{method,code}          counter
//	walcast_api_request_duration_seconds{method}     histogram
//
// method is "Service/Method" ("walcast.api.v1.BroadcastService/Broadcast");
// code is the Connect code name ("ok", "invalid_argument", "unavailable").
// Requests to paths that are not a known RPC (pages, probes, typos) are not
// counted, so the label values stay bounded.
type API struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	methods  map[string]*apiMethod // "/pkg.Service/Method" → a method of a served service
}

// apiMethod is one method's series, looked up once when the API is built:
// a call that succeeds touches no label (a vector's lookup hashes its label
// values on every call).
type apiMethod struct {
	name     string // "pkg.Service/Method", the method label
	ok       prometheus.Counter
	duration prometheus.Observer
}

// NewAPI registers the API metrics on reg, with the ok series of every
// method of services (full names) at zero.
func NewAPI(reg prometheus.Registerer, services ...string) (*API, error) {
	a := &API{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: "api", Name: "requests_total",
			Help: "API requests by procedure and status code (all protocols)."}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Subsystem: "api", Name: "request_duration_seconds",
			Help: "API request durations by procedure.", Buckets: durationBuckets}, []string{"method"}),
		methods: map[string]*apiMethod{},
	}
	for _, s := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(s))
		if err != nil {
			continue
		}
		sd, ok := d.(protoreflect.ServiceDescriptor)
		if !ok {
			continue
		}
		for i := range sd.Methods().Len() {
			m := s + "/" + string(sd.Methods().Get(i).Name())
			a.methods["/"+m] = &apiMethod{name: m, ok: a.requests.WithLabelValues(m, codeName(0)), duration: a.duration.WithLabelValues(m)}
		}
	}
	if err := reg.Register(a.requests); err != nil {
		return nil, err
	}
	if err := reg.Register(a.duration); err != nil {
		return nil, err
	}
	return a, nil
}

// Wrap returns h counting the RPCs it serves.
func (a *API) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := a.methods[r.URL.Path]
		if m == nil {
			h.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		rec := &codeRecorder{ResponseWriter: w, status: http.StatusOK, proto: protocolOf(r.Header.Get("Content-Type"))}
		h.ServeHTTP(rec, r)
		if code := rec.code(); code == 0 {
			m.ok.Inc()
		} else {
			a.requests.WithLabelValues(m.name, codeName(code)).Inc()
		}
		m.duration.Observe(time.Since(start).Seconds())
	})
}

// protocol is the RPC protocol of a request, which says where its status
// code is read from.
type protocol uint8

const (
	protoConnect protocol = iota // the HTTP status, and an error's JSON body
	protoGRPC                    // the grpc-status header or trailer
	protoGRPCWeb                 // the grpc-status header, or the trailers frame that ends the body
)

func protocolOf(contentType string) protocol {
	switch {
	case strings.HasPrefix(contentType, "application/grpc-web"):
		return protoGRPCWeb
	case strings.HasPrefix(contentType, "application/grpc"):
		return protoGRPC
	}
	return protoConnect
}

// codeRecorder keeps what the status code of an RPC is read from: the HTTP
// status, the start of an error body (Connect), the grpc-status header or
// trailer (gRPC) and the last frame written (gRPC-Web trailers). It keeps
// only the bytes its protocol needs: nothing of a Connect call that
// succeeds (status 200) or of a gRPC call.
type codeRecorder struct {
	http.ResponseWriter
	proto  protocol
	status int
	head   []byte // the first bytes of a Connect error body, up to 512
	last   []byte // the last 512 bytes written (gRPC-Web)
}

func (c *codeRecorder) WriteHeader(code int) {
	c.status = code
	c.ResponseWriter.WriteHeader(code)
}

func (c *codeRecorder) Write(b []byte) (int, error) {
	switch c.proto {
	case protoConnect:
		if c.status != http.StatusOK && len(c.head) < 512 {
			c.head = append(c.head, b[:min(len(b), 512-len(c.head))]...)
		}
	case protoGRPCWeb:
		// A rolling tail: a frame may come in several writes.
		c.last = append(c.last, b[max(0, len(b)-512):]...)
		if n := len(c.last); n > 512 {
			c.last = append(c.last[:0], c.last[n-512:]...)
		}
	}
	return c.ResponseWriter.Write(b)
}

// Flush lets streaming handlers flush through the recorder.
func (c *codeRecorder) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (c *codeRecorder) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *codeRecorder) code() connect.Code {
	switch c.proto {
	case protoGRPCWeb:
		if s := c.Header().Get("Grpc-Status"); s != "" {
			return grpcCode(s)
		}
		// Trailers are the last frame (flag 0x80, compressed 0x81): its
		// payload holds "grpc-status: N".
		if t := trailerFrame(c.last, c.Header().Get("Grpc-Encoding")); t != nil {
			if i := bytes.Index(bytes.ToLower(t), []byte("grpc-status:")); i >= 0 {
				rest := bytes.TrimSpace(t[i+len("grpc-status:"):])
				if j := bytes.IndexAny(rest, "\r\n"); j >= 0 {
					rest = rest[:j]
				}
				return grpcCode(string(rest))
			}
		}
	case protoGRPC:
		h := c.Header()
		if s := h.Get("Grpc-Status"); s != "" {
			return grpcCode(s)
		}
		if s := h.Get(http.TrailerPrefix + "Grpc-Status"); s != "" {
			return grpcCode(s)
		}
	default:
		if c.status == http.StatusOK {
			return 0
		}
		var e struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(c.head, &e) == nil && e.Code != "" {
			var code connect.Code
			if code.UnmarshalText([]byte(e.Code)) == nil {
				return code
			}
		}
		return connect.CodeUnknown
	}
	return connect.CodeUnknown
}

func grpcCode(s string) connect.Code {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n > 16 {
		return connect.CodeUnknown
	}
	return connect.Code(n)
}

// codeName is the label of a code: Connect's name, "ok" for success.
func codeName(c connect.Code) string {
	if c == 0 {
		return "ok"
	}
	return c.String()
}

// trailerFrame finds the gRPC-Web trailers frame that ends tail and returns
// its payload, gunzipped if the frame is compressed; nil if there is none.
func trailerFrame(tail []byte, encoding string) []byte {
	for i := len(tail) - 5; i >= 0; i-- {
		flag := tail[i]
		if flag&0x80 == 0 || int(binary.BigEndian.Uint32(tail[i+1:i+5])) != len(tail)-i-5 {
			continue
		}
		payload := tail[i+5:]
		if flag&0x01 == 0 {
			return payload
		}
		if encoding != "gzip" {
			return nil
		}
		zr, err := gzip.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil
		}
		out, err := io.ReadAll(io.LimitReader(zr, 4096))
		if err != nil {
			return nil
		}
		return out
	}
	return nil
}
