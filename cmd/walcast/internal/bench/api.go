package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// startStandalone starts `walcast standalone` as it runs by default (plain
// HTTP, embedded etcd and NATS syncing every write, the metadata service)
// in dir, on random ports, without metrics, audit or console noise.
func startStandalone(ctx context.Context, dir string, secure bool) (*server.Process, error) {
	return startStandaloneWith(ctx, dir, secure, nil)
}

// startMetaStandalone is startStandalone (plain HTTP) with the metadata
// service's configuration changed by mod.
func startMetaStandalone(ctx context.Context, dir string, mod func(*meta.Config)) (*server.Process, error) {
	return startStandaloneWith(ctx, dir, false, mod)
}

func startStandaloneWith(ctx context.Context, dir string, secure bool, mod func(*meta.Config)) (*server.Process, error) {
	cfg := server.Default()
	cfg.DataDir = dir
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.Audit.File = "off"
	cfg.API.Secure = secure
	mc := meta.Config{PChannels: cfg.PChannelNames(), ImportRoot: cfg.ImportRoot(), Logger: cfg.Logger()}
	if mod != nil {
		mod(&mc)
	}
	app, err := meta.NewApp(mc)
	if err != nil {
		return nil, err
	}
	p, err := server.StartStandalone(ctx, cfg, app)
	if err != nil {
		_ = app.Close()
		return nil, err
	}
	return p, nil
}

// clients returns n clients of addrs, each with its own HTTP transport and
// so its own connection.
func clients(addrs []string, n int, opts ...client.Option) ([]*client.Client, func(), error) {
	out := make([]*client.Client, 0, n)
	closeAll := func() {
		for _, c := range out {
			c.Close()
		}
	}
	for range n {
		c, err := client.New(addrs, opts...)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		out = append(out, c)
	}
	return out, closeAll, nil
}

// api measures B8, throughput through the Connect API from cfg.APIClients
// connections against in-process B2 in the same run (the two in turns:
// in-process, API, API, in-process), and B9, CreateCollection through the
// API from cfg.MetaClients connections on distinct collections, with the
// latency of one CreateCollection against B1 (b1, of this run). b2, B2's
// throughput on NATS in this run (0 if it did not run), is set beside B8
// in its note.
func (e *Env) api(ctx context.Context, cfg Config, b1 time.Duration, b2 float64, t *tracker) ([]Result, error) {
	addrs := cfg.APIAddrs
	var standalone *server.Process
	where := "a standalone in process (its coordinator calling the embedded etcd in process; NATS syncing every write)"
	if len(addrs) == 0 {
		dir, err := os.MkdirTemp("", "walcast-bench-api-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		t.say("B8/B9: starting a standalone")
		p, err := startStandalone(ctx, filepath.Join(dir, "standalone"), false)
		if err != nil {
			return nil, err
		}
		defer p.Close()
		standalone, addrs = p, []string{p.APIAddr()}
	} else {
		where = fmt.Sprintf("the coordinators at %v", addrs)
	}
	var out []Result
	if cfg.want("B8") {
		r, err := e.b8(ctx, cfg, addrs, where, standalone, b2, t)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	if cfg.want("B9") {
		rs, err := b9(ctx, cfg, addrs, b1, t)
		if err != nil {
			return out, err
		}
		out = append(out, rs...)
	}
	return out, nil
}

// b8 measures throughput through the API against in-process B2 on the
// same coordinator when it can: with standalone (the bench's own, in this
// process), the in-process phases broadcast through the standalone's own
// broadcaster, with the same message, targets and keys as the API's
// requests, while its streaming nodes consume both phases' copies alike,
// so that the ratio is what the API costs. Driving coordinators elsewhere
// (standalone nil), the in-process phases use a broadcaster of the
// bench's on its own etcd (over gRPC, as those coordinators reach theirs)
// and NATS.
func (e *Env) b8(ctx context.Context, cfg Config, addrs []string, where string, standalone *server.Process, b2 float64, t *tracker) (Result, error) {
	cs, closeAll, err := clients(addrs, cfg.APIClients)
	if err != nil {
		return Result{}, err
	}
	defer closeAll()
	for i, c := range cs { // connect every client
		if err := apiOnce(ctx, c, fmt.Sprint("warm", i)); err != nil {
			return Result{}, err
		}
	}
	inproc := func(ctx context.Context, key string) error { return coordinatorOnce(ctx, standalone, key) }
	floor := "B2 in this process on the same standalone's broadcaster (its etcd called in process, its NATS, its 2 streaming nodes consuming), in turns (ABBA)"
	if standalone == nil {
		b, err := e.newBroadcasterOn(ctx, e.natsBackend(), 4, broadcast.TombstoneConfig{})
		if err != nil {
			return Result{}, err
		}
		defer b.Close()
		targets := b.Targets(4, "v")
		inproc = func(ctx context.Context, key string) error {
			_, err := b.Once(ctx, key, targets)
			return err
		}
		floor = "B2 in this process on its own etcd (called over gRPC) and NATS, no streaming nodes, in turns (ABBA)"
	}
	if err := inproc(ctx, "warm"); err != nil {
		return Result{}, err
	}
	half := cfg.Duration / 2
	var inRate, api float64
	var inCPU, apiCPU phase
	for i, name := range []string{"in-process", "API", "API", "in-process"} {
		clients := cfg.APIClients
		st := t.timed(fmt.Sprintf("B8: %s, %d clients for %v (phase %d of 4)", name, clients, half, i+1), half)
		var ph phase
		if name == "API" {
			ph, err = measure(ctx, clients, half, st, func(ctx context.Context, c, j int) error {
				return apiOnce(ctx, cs[c], fmt.Sprintf("a%d-%d-%d", i, c, j))
			})
			api += ph.rate / 2
			apiCPU.ops, apiCPU.cpu = apiCPU.ops+ph.ops, apiCPU.cpu+ph.cpu
		} else {
			ph, err = measure(ctx, clients, half, st, func(ctx context.Context, c, j int) error {
				return inproc(ctx, fmt.Sprintf("p%d-%d-%d", i, c, j))
			})
			inRate += ph.rate / 2
			inCPU.ops, inCPU.cpu = inCPU.ops+ph.ops, inCPU.cpu+ph.cpu
		}
		st.end()
		if err != nil {
			return Result{}, err
		}
	}
	ratio := api / inRate
	// B2's own row is another broadcaster (its etcd over gRPC, no nodes
	// consuming): only noted.
	vsB2 := ""
	if b2 > 0 {
		vsB2 = fmt.Sprintf("; against this run's B2 row (another broadcaster: its etcd over gRPC, no nodes) %.2f", api/b2)
	}
	return Result{ID: "B8", Backend: NATS, What: fmt.Sprintf("end-to-end throughput through the Connect API, %d connections", cfg.APIClients),
		Value: api, Unit: "broadcasts/s", Floor: inRate, Ratio: ratio, Target: ">= 60% of in-process B2, same run", Pass: ratio >= 0.6,
		Note: fmt.Sprintf("API: %s, Go client, Connect protocol; floor: %s; "+
			"CPU per broadcast (this process: clients, server, etcd, NATS, nodes): API %.0f us, in-process %.0f us%s", where, floor, apiCPU.cpuPerOp(), inCPU.cpuPerOp(), vsB2)}, nil
}

// coordinatorOnce is one broadcast on p's own broadcaster, in process, as
// the API's Broadcast handler makes it for apiOnce's request: the same
// type, payload, targets and resource key, through Acquire and Broadcast.
func coordinatorOnce(ctx context.Context, p *server.Process, key string) error {
	b, err := p.Coord.Current()
	if err != nil {
		return err
	}
	msg, err := message.NewBroadcast(app.GenericType, []byte(apiPayload), apiTargets)
	if err != nil {
		return err
	}
	h, err := b.Acquire(ctx, broadcast.AcquireRequest{Keys: []resource.Key{apiKey(key)}})
	if err != nil {
		return err
	}
	defer h.Close()
	_, err = h.Broadcast(ctx, msg)
	return err
}

// b9 creates collections through the API: throughput from cfg.MetaClients
// connections on distinct collections, then the latency of one at a time.
func b9(ctx context.Context, cfg Config, addrs []string, b1 time.Duration, t *tracker) ([]Result, error) {
	cs, closeAll, err := clients(addrs, cfg.MetaClients)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	db := fmt.Sprintf("bench%d", time.Now().UnixNano()%1e9)
	if _, err := cs[0].CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: db}); err != nil {
		return nil, err
	}
	create := func(c *client.Client, name string) error {
		_, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: db, Name: name})
		return err
	}
	for i, c := range cs {
		if err := create(c, fmt.Sprint("warm", i)); err != nil {
			return nil, err
		}
	}
	st := t.timed(fmt.Sprintf("B9: CreateCollection from %d clients for %v", cfg.MetaClients, cfg.Duration), cfg.Duration)
	ph, err := measure(ctx, cfg.MetaClients, cfg.Duration, st, func(ctx context.Context, c, j int) error {
		return create(cs[c], fmt.Sprintf("c%d_%d", c, j))
	})
	st.end()
	rate := ph.rate
	if err != nil {
		return nil, err
	}
	st = t.counted(fmt.Sprintf("B9: %d CreateCollection one at a time", cfg.Samples), cfg.Samples)
	lat := make([]time.Duration, 0, cfg.Samples)
	for i := range cfg.Samples {
		start := time.Now()
		if err := create(cs[0], fmt.Sprint("s", i)); err != nil {
			st.end()
			return nil, err
		}
		lat = append(lat, time.Since(start))
		st.add(1)
	}
	st.end()
	p50, p99 := Median(lat), Quantile(lat, 0.99)
	single := Result{ID: "B9", Backend: NATS, What: "one CreateCollection through the API, p50", Value: ms(p50), Unit: "ms",
		Target: "report (floor: B1 of this run)", Pass: true, Note: fmt.Sprintf("p99 %.2f ms", ms(p99))}
	if b1 > 0 {
		single.Floor, single.Ratio = ms(b1), float64(p50)/float64(b1)
		single.Note += fmt.Sprintf("; p99 / B1 p50 %.2f", float64(p99)/float64(b1))
	}
	return []Result{
		{ID: "B9", Backend: NATS, What: fmt.Sprintf("CreateCollection through the API, %d clients on distinct collections", cfg.MetaClients),
			Value: rate, Unit: "collections/s", Target: ">= 2000/s", Pass: rate >= 2000,
			Note: fmt.Sprintf("CPU per CreateCollection %.0f us (this process: clients, server, etcd, NATS, nodes); the reference system's users report 10-28/s", ph.cpuPerOp())},
		single,
	}, nil
}
