package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// Durability is what a coordinator found, at start, about how its catalog
// and its WAL keep what it acknowledges (SPEC R9.11). A DDL is reported
// done once its task is in the catalog and its copies are in the WAL, so
// both must survive the loss of a machine.
type Durability struct {
	// Lines describe the effective settings, one backend per line.
	Lines []string
	// Notes are limits worth knowing that lose nothing acknowledged (no
	// redundancy, a client that knows few endpoints).
	Notes []string
	// Unsafe are settings under which a DDL reported done can be lost;
	// the coordinator refuses them unless durability.allow_unsafe.
	Unsafe []string
}

// String is the report a coordinator prints at start.
func (d Durability) String() string {
	var b strings.Builder
	b.WriteString("durability:")
	for _, l := range d.Lines {
		b.WriteString("\n  " + l)
	}
	for _, n := range d.Notes {
		b.WriteString("\n  note: " + n)
	}
	for _, u := range d.Unsafe {
		b.WriteString("\n  UNSAFE: " + u)
	}
	return b.String()
}

// durabilityTimeout bounds the checks at start.
const durabilityTimeout = 10 * time.Second

// checkDurability inspects the etcd cluster behind client and the WAL log of
// cfg (a *walnats.Log or *walkafka.Log) over lanes.
func checkDurability(ctx context.Context, cfg Config, client *clientv3.Client, log any, lanes []message.PChannel) Durability {
	ctx, cancel := context.WithTimeout(ctx, durabilityTimeout)
	defer cancel()
	var d Durability
	checkEtcd(ctx, cfg, client, &d)
	switch l := log.(type) {
	case *walnats.Log:
		checkNATS(ctx, cfg, l, lanes, &d)
	case *walkafka.Log:
		checkKafka(ctx, l, lanes, &d)
	}
	return d
}

func checkEtcd(ctx context.Context, cfg Config, client *clientv3.Client, d *Durability) {
	c := cfg.Catalog
	keep := fmt.Sprintf("keepalive %v + %v", c.KeepaliveTime.D(), c.KeepaliveTimeout.D())
	ml, err := client.MemberList(ctx)
	if err != nil {
		d.Lines = append(d.Lines, fmt.Sprintf("catalog: etcd, %d endpoints, %s; member list: %v", len(c.Endpoints), keep, err))
		d.Notes = append(d.Notes, "the etcd member list could not be read: its redundancy is unknown")
		return
	}
	voters, learners := 0, 0
	for _, m := range ml.Members {
		if m.IsLearner {
			learners++
		} else {
			voters++
		}
	}
	line := fmt.Sprintf("catalog: etcd cluster of %d voting members", voters)
	if learners > 0 {
		line += fmt.Sprintf(" (+%d learners)", learners)
	}
	line += fmt.Sprintf(", client endpoints %d, %s, election ttl %v; etcd fsyncs every write (unless started with --unsafe-no-fsync)",
		len(c.Endpoints), keep, cfg.Election.TTL.D())
	d.Lines = append(d.Lines, line)
	switch {
	case voters < 3:
		d.Notes = append(d.Notes, fmt.Sprintf("etcd has %d voting members: the loss of one stops the catalog (3 or 5 tolerate 1 or 2)", voters))
	case voters%2 == 0:
		d.Notes = append(d.Notes, fmt.Sprintf("etcd has %d voting members: an even count tolerates no more losses than %d", voters, voters-1))
	}
	if len(c.Endpoints) < voters && c.AutoSyncInterval == 0 {
		d.Notes = append(d.Notes, fmt.Sprintf("the client knows %d endpoints of %d members: list them all in catalog.endpoints (or set catalog.auto_sync_interval), or it cannot move to the others", len(c.Endpoints), voters))
	}
	if c.KeepaliveTime+c.KeepaliveTimeout >= cfg.Election.TTL {
		d.Notes = append(d.Notes, fmt.Sprintf("catalog.keepalive_time + keepalive_timeout (%v) is not below election.ttl (%v): a member that hangs can cost the leader its lease",
			(c.KeepaliveTime+c.KeepaliveTimeout).D(), cfg.Election.TTL.D()))
	}
}

// varz is the part of NATS's /varz a coordinator checks.
type varz struct {
	Name      string `json:"server_name"`
	JetStream struct {
		Config *struct {
			SyncAlways   bool          `json:"sync_always"`
			SyncInterval time.Duration `json:"sync_interval"`
		} `json:"config"`
	} `json:"jetstream"`
}

// fetchVarz reads a server's /varz.
func fetchVarz(ctx context.Context, base string) (varz, error) {
	var v varz
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/varz", nil)
	if err != nil {
		return v, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("%s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4<<20)).Decode(&v); err != nil {
		return v, fmt.Errorf("/varz: %w", err)
	}
	if v.JetStream.Config == nil {
		return v, fmt.Errorf("server %s does not run JetStream", v.Name)
	}
	return v, nil
}

func checkNATS(ctx context.Context, cfg Config, l *walnats.Log, lanes []message.PChannel, d *Durability) {
	// Which servers sync every write, by server name.
	syncs := map[string]bool{}
	var unreachable []string
	for _, u := range cfg.WAL.NATS.MonitorURLs {
		v, err := fetchVarz(ctx, u)
		if err != nil {
			unreachable = append(unreachable, fmt.Sprintf("%s (%v)", u, err))
			continue
		}
		syncs[v.Name] = v.JetStream.Config.SyncAlways
		if !v.JetStream.Config.SyncAlways {
			d.Unsafe = append(d.Unsafe, fmt.Sprintf("NATS server %s does not sync every write (jetstream sync_interval %v): a machine crash loses acknowledged entries; set `jetstream { sync_interval: always }`",
				v.Name, v.JetStream.Config.SyncInterval))
		}
	}
	var streams []string
	hosts := map[string]bool{}
	clustered := false
	for _, p := range lanes {
		info, err := streamInfo(ctx, l, p)
		if err != nil {
			streams = append(streams, fmt.Sprintf("%s: %v", l.Stream(p), err))
			d.Notes = append(d.Notes, fmt.Sprintf("stream %s could not be inspected: %v", l.Stream(p), err))
			continue
		}
		desc := fmt.Sprintf("%s R%d", info.Config.Name, info.Config.Replicas)
		if c := info.Cluster; c != nil {
			if c.Name != "" {
				clustered = true
			}
			if c.Leader != "" {
				hosts[c.Leader] = true
				desc += " leader " + c.Leader
			}
			current := 0
			for _, r := range c.Replicas {
				hosts[r.Name] = true
				if r.Current && !r.Offline {
					current++
				}
			}
			if len(c.Replicas) > 0 {
				desc += fmt.Sprintf(", %d of %d followers current", current, len(c.Replicas))
			}
		}
		streams = append(streams, desc)
		if clustered && info.Config.Replicas < 3 {
			d.Unsafe = append(d.Unsafe, fmt.Sprintf("stream %s has %d replica(s) on a NATS cluster: losing its server loses acknowledged entries; set wal.nats.replicas to 3", info.Config.Name, info.Config.Replicas))
		}
		if info.Config.Storage != jetstream.FileStorage {
			d.Unsafe = append(d.Unsafe, fmt.Sprintf("stream %s does not use file storage", info.Config.Name))
		}
	}
	verified := 0
	var unverified []string
	for _, h := range slices.Sorted(maps.Keys(hosts)) {
		if _, ok := syncs[h]; ok {
			verified++
		} else {
			unverified = append(unverified, h)
		}
	}
	syncLine := "sync every write: "
	switch {
	case len(cfg.WAL.NATS.MonitorURLs) == 0:
		syncLine += "not verified (no wal.nats.monitor_urls)"
		d.Unsafe = append(d.Unsafe, "cannot verify that the NATS servers sync every write (jetstream sync_interval: always): set wal.nats.monitor_urls (--nats-monitor) to their monitoring endpoints, http://host:8222")
	case len(syncs) == 0:
		syncLine += "not verified (no monitoring endpoint answered)"
		d.Unsafe = append(d.Unsafe, "no NATS monitoring endpoint answered: cannot verify that the servers sync every write: "+strings.Join(unreachable, ", "))
	default:
		syncLine += fmt.Sprintf("checked on %d servers via /varz", len(syncs))
		if len(hosts) > 0 {
			syncLine += fmt.Sprintf(" (%d of the %d hosting the streams)", verified, len(hosts))
		}
		if len(unverified) > 0 {
			d.Notes = append(d.Notes, "NATS servers hosting the streams not checked (not in wal.nats.monitor_urls or not answering): "+strings.Join(unverified, ", "))
		}
		if len(unreachable) > 0 {
			d.Notes = append(d.Notes, "NATS monitoring endpoints not answering: "+strings.Join(unreachable, ", "))
		}
	}
	kind := "single server"
	if clustered {
		kind = "cluster"
	}
	d.Lines = append(d.Lines, fmt.Sprintf("wal: NATS JetStream %s, streams %s; %s; duplicate window %v", kind, strings.Join(streams, "; "), syncLine, cfg.WAL.NATS.DedupWindow.D()))
	if !clustered {
		d.Notes = append(d.Notes, "the WAL is one NATS server: losing its disk loses the WAL (a JetStream cluster with wal.nats.replicas 3 survives it)")
	}
}

func checkKafka(ctx context.Context, l *walkafka.Log, lanes []message.PChannel, d *Durability) {
	var topics []string
	for _, p := range lanes {
		st, err := l.TopicStatus(ctx, p)
		if err != nil {
			topics = append(topics, fmt.Sprintf("%s: %v", l.Topic(p), err))
			d.Notes = append(d.Notes, fmt.Sprintf("topic %s could not be inspected: %v", l.Topic(p), err))
			continue
		}
		rf := len(st.Replicas)
		mir := "unknown"
		if st.MinInsyncReplicas > 0 {
			mir = fmt.Sprint(st.MinInsyncReplicas)
		}
		topics = append(topics, fmt.Sprintf("%s RF %d, ISR %d, min.insync.replicas %s, leader %d of %d brokers", st.Topic, rf, len(st.ISR), mir, st.Leader, st.Brokers))
		switch {
		case rf == 1 && st.Brokers >= 3:
			d.Unsafe = append(d.Unsafe, fmt.Sprintf("topic %s has one replica on a cluster of %d brokers: losing that broker loses acknowledged entries; create it with replication factor 3", st.Topic, st.Brokers))
		case rf == 1:
			d.Notes = append(d.Notes, fmt.Sprintf("topic %s has one replica: losing its broker's disk loses the WAL", st.Topic))
		case st.MinInsyncReplicas == 0:
			d.Notes = append(d.Notes, fmt.Sprintf("topic %s: min.insync.replicas could not be read (describe configs denied)", st.Topic))
		case st.MinInsyncReplicas < 2:
			d.Unsafe = append(d.Unsafe, fmt.Sprintf("topic %s has min.insync.replicas %d: with acks=all, a leader alone in the ISR acknowledges appends that its loss loses; set min.insync.replicas 2", st.Topic, st.MinInsyncReplicas))
		}
	}
	d.Lines = append(d.Lines, "wal: Kafka, producer acks=all, idempotent; topics "+strings.Join(topics, "; "))
}

// streamInfo asks about p's stream; a stream just created on a cluster has
// no leader for a moment, so it asks again for up to 3 s to report one.
func streamInfo(ctx context.Context, l *walnats.Log, p message.PChannel) (*jetstream.StreamInfo, error) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		info, err := l.StreamInfo(ctx, p)
		if err != nil || info.Cluster == nil || info.Cluster.Name == "" || info.Cluster.Leader != "" || time.Now().After(deadline) {
			return info, err
		}
		if !wait.Sleep(ctx, 50*time.Millisecond) {
			return info, nil
		}
	}
}
