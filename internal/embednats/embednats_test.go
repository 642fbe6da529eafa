package embednats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/walcast/walcast/internal/wait"
	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines, but for two of nats-server's own:
// a clustered server shut down while JetStream is still starting can leave
// its raft log's file store running (nats-server 2.15.2), which only
// TestClusterStartsAgainWhenARoutePortIsTaken does, on purpose (the
// attempt that fails). The packages that run the log on embedded servers
// check for leaks without these exceptions.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"))
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Start(tctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func connect(t *testing.T, s *Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func port(t *testing.T, s *Server) int {
	t.Helper()
	u, err := url.Parse(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestStartServesJetStreamOnLoopback(t *testing.T) {
	s := start(t, Config{Dir: t.TempDir(), SyncAlways: true})
	u, err := url.Parse(s.ClientURL())
	if err != nil || u.Hostname() != "127.0.0.1" || port(t, s) <= 0 {
		t.Fatalf("ClientURL %q (%v): want nats://127.0.0.1:<port>", s.ClientURL(), err)
	}
	nc, js := connect(t, s)
	if got := nc.MaxPayload(); got != DefaultMaxPayload {
		t.Fatalf("max payload %d, want %d", got, DefaultMaxPayload)
	}
	ctx := tctx(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s", make([]byte, DefaultMaxPayload-100)); err != nil {
		t.Fatalf("publishing near max payload: %v", err)
	}
}

func TestSyncSettingTakesEffect(t *testing.T) {
	for _, always := range []bool{true, false} {
		s := start(t, Config{Dir: t.TempDir(), SyncAlways: always})
		if got := s.ns.JetStreamConfig().SyncAlways; got != always {
			t.Fatalf("SyncAlways %v: JetStream runs with %v", always, got)
		}
	}
}

func TestMaxPayload(t *testing.T) {
	s := start(t, Config{Dir: t.TempDir(), MaxPayload: 2 << 20})
	nc, _ := connect(t, s)
	if got := nc.MaxPayload(); got != 2<<20 {
		t.Fatalf("max payload %d, want %d", got, 2<<20)
	}
}

func TestRestartKeepsStreams(t *testing.T) {
	dir := t.TempDir()
	ctx := tctx(t)
	s := start(t, Config{Dir: dir, SyncAlways: true})
	_, js := connect(t, s)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"one", "two"} {
		if _, err := js.Publish(ctx, "s", []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s.Close() // idempotent

	s2 := start(t, Config{Dir: dir, SyncAlways: true})
	_, js2 := connect(t, s2)
	st, err := js2.Stream(ctx, "S")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	for seq, want := range map[uint64]string{1: "one", 2: "two"} {
		m, err := st.GetMsg(ctx, seq)
		if err != nil || string(m.Data) != want {
			t.Fatalf("message %d after restart: %q, %v; want %q", seq, m.Data, err, want)
		}
	}
}

func TestStartErrors(t *testing.T) {
	ctx := tctx(t)
	for name, cfg := range map[string]Config{
		"no dir":           {},
		"negative port":    {Dir: t.TempDir(), Port: -1},
		"port too big":     {Dir: t.TempDir(), Port: 70000},
		"payload too big":  {Dir: t.TempDir(), MaxPayload: 65 << 20},
		"negative payload": {Dir: t.TempDir(), MaxPayload: -1},
	} {
		if _, err := Start(ctx, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}

	// A port in use is reported, not a process exit.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := l.Addr().(*net.TCPAddr).Port
	s, err := Start(ctx, Config{Dir: t.TempDir(), Port: busy})
	if err == nil {
		s.Close()
		t.Fatal("started on a port in use")
	}
	if !strings.Contains(err.Error(), "listening") {
		t.Fatalf("port in use: %v, want the listen error", err)
	}

	// A context that ends first stops the start.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if s, err := Start(done, Config{Dir: t.TempDir()}); !errors.Is(err, context.Canceled) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("canceled context: %v", err)
	}
}

func TestFixedPort(t *testing.T) {
	s := start(t, Config{Dir: t.TempDir()})
	p := port(t, s)
	s.Close()
	s2 := start(t, Config{Dir: t.TempDir(), Port: p})
	if got := port(t, s2); got != p {
		t.Fatalf("port %d, want %d", got, p)
	}
}

// retryFor runs op, each attempt bounded by per, until it succeeds; the
// test fails with op's last error once total has passed.
func retryFor(t *testing.T, ctx context.Context, what string, total, per time.Duration, op func(context.Context) error) {
	t.Helper()
	for deadline := time.Now().Add(total); ; {
		actx, cancel := context.WithTimeout(ctx, per)
		err := op(actx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %v; retrying", what, err)
	}
}

// TestClusterReplicatedStream runs three clustered servers: a stream with
// three replicas gets a leader and two current followers, its messages
// survive the loss of one server (the leader), and each server's /varz
// reports the sync setting walcast checks.
func TestClusterReplicatedStream(t *testing.T) {
	// Three servers fsyncing every write on a loaded CI machine: the
	// cluster's start and the stream's first election may take a while.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	servers, err := StartCluster(ctx, "c", t.TempDir(), 3, Config{SyncAlways: true, Monitor: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		t.Cleanup(s.Close)
	}
	var urls []string
	for _, s := range servers {
		urls = append(urls, s.ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// A create request the meta leader does not answer (CI saw one wait out
	// the test's 20 s) is sent again; creating a stream with the same
	// configuration is idempotent.
	var st jetstream.Stream
	retryFor(t, ctx, "create stream", 40*time.Second, 5*time.Second, func(ctx context.Context) (err error) {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r"}, Storage: jetstream.FileStorage, Replicas: 3})
		return err
	})
	// The stream was just created: its replicas may still be electing
	// their first leader, and a publish meanwhile gets no answer ("no
	// response from stream", as CI saw once). Retried with a message id,
	// as the WAL does, so that it lands once.
	retryFor(t, ctx, "first publish", 15*time.Second, time.Second, func(ctx context.Context) error {
		_, err := js.Publish(ctx, "r", []byte("one"), jetstream.WithMsgID("one"))
		return err
	})
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster == nil || info.Cluster.Name != "c" || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("cluster info %+v", info.Cluster)
	}
	// Stop the leader: another server leads and has the message (each
	// attempt bounded: a request sent on the dead server's connection is
	// never answered).
	for _, s := range servers {
		if s.Name() == info.Cluster.Leader {
			s.Close()
		}
	}
	wait.ForNil(t, "the message after the leader stopped", func() error {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		m, err := st.GetMsg(actx, 1)
		if err == nil && string(m.Data) != "one" {
			err = fmt.Errorf("message %q", m.Data)
		}
		return err
	})
	for _, s := range servers {
		if s.Name() == info.Cluster.Leader {
			continue
		}
		if s.MonitorURL() == "" {
			t.Fatal("no monitor URL")
		}
		resp, err := http.Get(s.MonitorURL() + "/varz")
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Name      string `json:"server_name"`
			JetStream struct {
				Config struct {
					SyncAlways bool `json:"sync_always"`
				} `json:"config"`
			} `json:"jetstream"`
		}
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if err != nil || v.Name != s.Name() || !v.JetStream.Config.SyncAlways {
			t.Fatalf("varz of %s: %+v, %v", s.Name(), v, err)
		}
	}
}

// TestClusterStartsAgainWhenARoutePortIsTaken: a route port taken between
// its pick and its server's listen (another process's socket) fails that
// attempt fast, and the cluster starts on other ports.
func TestClusterStartsAgainWhenARoutePortIsTaken(t *testing.T) {
	attempts := 0
	testHookClusterPorts = func(ports []int) {
		attempts++
		if attempts > 1 {
			return
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(ports[1]))
		if err != nil {
			t.Errorf("take port %d: %v", ports[1], err)
			return
		}
		t.Cleanup(func() { _ = l.Close() })
	}
	defer func() { testHookClusterPorts = nil }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	servers, err := StartCluster(ctx, "c", t.TempDir(), 3, Config{SyncAlways: true})
	if err != nil {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	for _, s := range servers {
		s.Close()
	}
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2: the first, on the taken port, and one more", attempts)
	}
}
