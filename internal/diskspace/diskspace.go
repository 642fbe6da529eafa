// Package diskspace watches the free space of the file systems a walcast
// process writes to (its data directory: the embedded etcd's and NATS's
// stores, the nodes' state) and says when writes must stop.
//
// An embedded etcd that runs out of space exits the process from inside
// (its storage layer cannot continue after a failed write), and an embedded
// NATS server disables JetStream. walcast stops writing before that: below
// Config.Reserve free bytes, Check fails, and the process refuses catalog
// and WAL writes with a definite error (nothing was written), keeps
// serving reads and reports not ready, until space is freed. Below
// Config.Warn it warns (log, readiness detail, metrics) while writes go on.
//
// Free space is sampled with statfs(2): by Check when its last sample is
// older than Config.MaxAge, and by Run every Config.Interval, which also
// logs the transitions between the levels.
package diskspace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ErrNoSpace is wrapped by Check's error: a watched file system has less
// free space than the reserve.
var ErrNoSpace = errors.New("no space left for walcast's data")

// ErrInvalidConfig reports a Config New cannot use.
var ErrInvalidConfig = errors.New("diskspace: invalid config")

// Defaults of Config.
const (
	DefaultInterval = time.Second
	DefaultMaxAge   = 100 * time.Millisecond
)

// Dir is a watched directory.
type Dir struct {
	// Name is what logs, metrics and readiness call it ("catalog", "wal").
	Name string
	// Path is the directory; its file system is what is measured.
	Path string
}

// Config configures a Monitor.
type Config struct {
	// Dirs are the directories watched (at least one).
	Dirs []Dir
	// Reserve is the free space below which Check fails; 0 never fails.
	Reserve uint64
	// Warn is the free space below which the level is Warning; at least
	// Reserve (0: the reserve).
	Warn uint64
	// Interval is how often Run samples; 0 means DefaultInterval.
	Interval time.Duration
	// MaxAge is how old a sample Check may rely on; 0 means DefaultMaxAge.
	MaxAge time.Duration
	// Logger receives the transitions; nil discards them.
	Logger *slog.Logger
	// Statfs measures a path's file system: free bytes (available to
	// walcast) and its size. Nil means statfs(2); tests inject faults
	// through it.
	Statfs func(path string) (free, total uint64, err error)
}

// Level says how a directory's free space compares with the thresholds.
type Level int

// Levels.
const (
	// OK: above the warning threshold.
	OK Level = iota
	// Warning: below the warning threshold; writes go on.
	Warning
	// Low: below the reserve; writes are refused.
	Low
	// Unknown: the file system could not be measured (writes go on).
	Unknown
)

var levelNames = [...]string{OK: "ok", Warning: "warning", Low: "low", Unknown: "unknown"}

func (l Level) String() string { return levelNames[l] }

// Status is one directory's last sample.
type Status struct {
	Dir
	Free, Total uint64
	Level       Level
	Err         error // why the sample failed (Level Unknown)
	At          time.Time
}

// Monitor watches the directories of a Config. It is safe for concurrent
// use.
type Monitor struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	status []Status // protected by mu
	at     time.Time
}

// New returns a Monitor and takes its first sample.
func New(cfg Config) (*Monitor, error) {
	if len(cfg.Dirs) == 0 {
		return nil, fmt.Errorf("%w: no directory", ErrInvalidConfig)
	}
	if cfg.Warn < cfg.Reserve {
		cfg.Warn = cfg.Reserve
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Statfs == nil {
		cfg.Statfs = statfs
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{cfg: cfg, log: log, status: make([]Status, len(cfg.Dirs))}
	for i, d := range cfg.Dirs {
		m.status[i] = Status{Dir: d, Level: OK}
	}
	m.mu.Lock()
	m.sampleLocked(time.Now())
	m.mu.Unlock()
	return m, nil
}

// Reserve is the configured reserve.
func (m *Monitor) Reserve() uint64 { return m.cfg.Reserve }

// WarnAt is the configured warning threshold.
func (m *Monitor) WarnAt() uint64 { return m.cfg.Warn }

// Check returns nil while every directory has at least the reserve free,
// else an error wrapping ErrNoSpace that names the directory, its free
// space and the reserve. It samples again when its last sample is older
// than Config.MaxAge.
func (m *Monitor) Check() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if now := time.Now(); now.Sub(m.at) >= m.cfg.MaxAge {
		m.sampleLocked(now)
	}
	for _, s := range m.status {
		if s.Level == Low {
			return &LowError{Status: s, Reserve: m.cfg.Reserve}
		}
	}
	return nil
}

// Status returns every directory's last sample.
func (m *Monitor) Status() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Status(nil), m.status...)
}

// Run samples every Config.Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.mu.Lock()
			m.sampleLocked(now)
			m.mu.Unlock()
		}
	}
}

func (m *Monitor) sampleLocked(now time.Time) {
	m.at = now
	for i := range m.status {
		s := &m.status[i]
		prev := s.Level
		s.At = now
		s.Free, s.Total, s.Err = m.cfg.Statfs(s.Path)
		switch {
		case s.Err != nil:
			s.Level = Unknown
		case m.cfg.Reserve > 0 && s.Free < m.cfg.Reserve:
			s.Level = Low
		case s.Free < m.cfg.Warn:
			s.Level = Warning
		default:
			s.Level = OK
		}
		if s.Level == prev {
			continue
		}
		attrs := []any{"dir", s.Name, "path", s.Path, "free_bytes", s.Free, "reserve_bytes", m.cfg.Reserve, "warn_bytes", m.cfg.Warn}
		switch s.Level {
		case Low:
			m.log.Error("disk nearly full: catalog and WAL writes are refused until space is freed", attrs...)
		case Warning:
			m.log.Warn("disk space low", attrs...)
		case Unknown:
			m.log.Warn("cannot measure free disk space", append(attrs, "err", s.Err)...)
		default:
			m.log.Info("disk space back above the thresholds", attrs...)
		}
	}
}

// LowError is Check's error: a directory below the reserve.
type LowError struct {
	Status
	Reserve uint64
}

func (e *LowError) Error() string {
	return fmt.Sprintf("%s: %s (%s) has %s free, below the reserve of %s: writes are refused until space is freed",
		ErrNoSpace, e.Name, e.Path, Bytes(e.Free), Bytes(e.Reserve))
}

// Unwrap makes errors.Is(err, ErrNoSpace) hold.
func (e *LowError) Unwrap() error { return ErrNoSpace }

// Bytes writes a byte count for people: "312 MiB".
func Bytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
