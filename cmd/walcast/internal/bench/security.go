package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/tlsfiles"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// apiPair is two standalone processes on their own embedded backends: one
// as `walcast standalone` runs by default (plain HTTP, no credentials), one
// secure (TLS and a bearer token, as --secure), each with a client.
type apiPair struct {
	plain, secure   *server.Process
	plainC, secureC *client.Client
}

func startAPIPair(ctx context.Context, dir string) (*apiPair, error) {
	p := &apiPair{}
	start := func(name string, secure bool) (*server.Process, *client.Client, error) {
		cfg := server.Default()
		cfg.DataDir = filepath.Join(dir, name)
		cfg.API.Addr = "127.0.0.1:0"
		cfg.Metrics.Addr = ""
		cfg.Log.Level = "error"
		cfg.Audit.File = "off"
		cfg.API.Secure = secure
		proc, err := server.StartStandalone(ctx, cfg, app.Generic{})
		if err != nil {
			return nil, nil, err
		}
		var opts []client.Option
		if f := proc.Secure(); f != nil {
			tc, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: f.CACert})
			if err != nil {
				proc.Close()
				return nil, nil, err
			}
			opts = append(opts, client.WithTLS(tc), client.WithTokenFile(f.AdminToken))
		}
		c, err := client.New([]string{proc.APIAddr()}, opts...)
		if err != nil {
			proc.Close()
			return nil, nil, err
		}
		return proc, c, nil
	}
	var err error
	if p.plain, p.plainC, err = start("plain", false); err != nil {
		return nil, err
	}
	if p.secure, p.secureC, err = start("secure", true); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *apiPair) Close() {
	for _, c := range []*client.Client{p.plainC, p.secureC} {
		if c != nil {
			c.Close()
		}
	}
	for _, s := range []*server.Process{p.plain, p.secure} {
		if s != nil {
			_ = s.Close()
		}
	}
}

// apiOnce broadcasts one Generic message to 4 vchannels on 4 pchannels
// through the API, under an exclusive key of its own.
func apiOnce(ctx context.Context, c *client.Client, key string) error {
	_, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(apiPayload),
		VChannels: apiTargets, ResourceKeys: []resource.Key{apiKey(key)}})
	return err
}

// apiPayload and apiTargets are the payload and the targets of apiOnce's
// broadcasts (and of coordinatorOnce's): 4 vchannels on the standalone's 4
// pchannels.
const apiPayload = "bench payload"

var apiTargets = []message.VChannel{"wal-0/v0", "wal-1/v1", "wal-2/v2", "wal-3/v3"}

// apiKey is the resource key of apiOnce's broadcast named key.
func apiKey(key string) resource.Key { return resource.ExclusiveCollection("bench", key) }

// security measures what TLS and authentication cost through the API (R9.8):
// S1 is B1 through the API, the plain and the secure process taking turns
// sample by sample so that both see the same machine; S2 is B2's
// throughput through the API, the two in turns (plain, secure, secure,
// plain).
// Clients keep their connections, as real ones do: the handshake is paid
// once per connection, the token check (a SHA-256 and a map lookup once
// verified) on every call.
func security(ctx context.Context, cfg Config, want func(string) bool, t *tracker) ([]Result, error) {
	dir, err := os.MkdirTemp("", "walcast-bench-api-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	t.say("S1/S2: starting a plain and a secure (TLS + token) standalone")
	p, err := startAPIPair(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	for _, c := range []*client.Client{p.plainC, p.secureC} {
		if err := apiOnce(ctx, c, "warm"); err != nil {
			return nil, err
		}
	}
	var out []Result
	if want("S1") {
		st := t.counted(fmt.Sprintf("S1: %d sequential API broadcasts each, plain and secure in turns", cfg.Samples), cfg.Samples)
		plain := make([]time.Duration, 0, cfg.Samples)
		secure := make([]time.Duration, 0, cfg.Samples)
		for i := range cfg.Samples {
			for _, s := range []struct {
				c   *client.Client
				lat *[]time.Duration
			}{{p.plainC, &plain}, {p.secureC, &secure}} {
				t0 := time.Now()
				if err := apiOnce(ctx, s.c, fmt.Sprint("k", i)); err != nil {
					return out, err
				}
				*s.lat = append(*s.lat, time.Since(t0))
			}
			st.add(1)
		}
		st.end()
		pm, sm := Median(plain), Median(secure)
		out = append(out, Result{ID: "S1", What: "B1 through the API with TLS + token: Broadcast latency p50", Value: ms(sm), Unit: "ms",
			Floor: ms(pm), Ratio: float64(sm) / float64(pm), Target: "report (floor: the same without TLS and auth)", Pass: true,
			Note: fmt.Sprintf("plain API p50 %.2f ms, +%.3f ms with TLS + token", ms(pm), ms(sm-pm))})
	}
	if want("S2") {
		// ABBA: four phases of half the duration, so that drift and other
		// load on the machine weigh on both sides alike.
		var plain, secure float64
		for i, c := range []*client.Client{p.plainC, p.secureC, p.secureC, p.plainC} {
			kind := "plain"
			if c == p.secureC {
				kind = "secure"
			}
			st := t.timed(fmt.Sprintf("S2: %d API clients, %s, for %v (phase %d of 4)", cfg.Clients, kind, cfg.Duration/2, i+1), cfg.Duration/2)
			r, err := parallel(ctx, cfg.Clients, cfg.Duration/2, st, func(ctx context.Context, cl, j int) error {
				return apiOnce(ctx, c, fmt.Sprintf("r%d-%d-%d", i, cl, j))
			})
			st.end()
			if err != nil {
				return out, err
			}
			if c == p.plainC {
				plain += r / 2
			} else {
				secure += r / 2
			}
		}
		out = append(out, Result{ID: "S2", What: fmt.Sprintf("API throughput with TLS + token, %d clients", cfg.Clients), Value: secure,
			Unit: "broadcasts/s", Floor: plain, Ratio: secure / plain, Target: "report (floor: the same without TLS and auth)", Pass: true,
			Note: fmt.Sprintf("plain API %.0f/s", plain)})
	}
	return out, nil
}
