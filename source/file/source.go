package file

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/service"
)

// The life of a Source:
//
//  1. Load reads the path; on success it delivers every object as an add,
//     then OnSynced; on error nothing is delivered and the error says where.
//  2. Run watches the path (fsnotify on the directory, so that editors'
//     rename-and-replace and ConfigMap symlink swaps are seen) and polls it
//     as a fallback; each change, after a short debounce, triggers Reload.
//  3. Reload reads everything again; unchanged content is ignored; a bad
//     read keeps the last good state (logged once, counted, LastError); a
//     good one delivers the difference: deletes, then updates, then adds.
//     A file of zero bytes counts as bad on reload: it is what a reader
//     sees between an in-place writer's truncate and write.

// Defaults of the options.
const (
	DefaultPollInterval = 5 * time.Second
	DefaultDebounce     = 100 * time.Millisecond
)

// Option configures a Source.
type Option func(*Source)

// WithClock sets the clock of the poll and debounce timers (default real).
func WithClock(c service.Clock) Option { return func(s *Source) { s.clock = c } }

// WithPollInterval sets how often Run re-reads the path whatever fsnotify
// says (default DefaultPollInterval); 0 disables polling.
func WithPollInterval(d time.Duration) Option { return func(s *Source) { s.poll = d } }

// WithDebounce sets how long Run waits after a file event before reloading,
// so that a burst of writes loads once (default DefaultDebounce).
func WithDebounce(d time.Duration) Option { return func(s *Source) { s.debounce = d } }

// WithFSNotify turns file-system notifications on (the default) or off
// (polling only).
func WithFSNotify(on bool) Option { return func(s *Source) { s.notify = on } }

// WithServiceCheck adds a check that every Service must pass, beyond
// service.ValidateService: cmd checks the userproxy.io/scheduler annotation
// with it (the scheduler names live in balancer, which source must not
// import). A Service that fails it fails the load, naming the file, the
// document and the Service.
func WithServiceCheck(check func(*v1.Service) error) Option {
	return func(s *Source) { s.checkSvc = check }
}

// Source reads Services and EndpointSlices from a file or a directory and
// delivers them to a service.Handler. All methods are safe for concurrent
// use; loads are serialized, and the handler is called from the goroutine
// of Load, Reload or Run.
type Source struct {
	path     string
	h        service.Handler
	log      *zap.Logger
	clock    service.Clock
	poll     time.Duration
	debounce time.Duration
	notify   bool
	checkSvc func(*v1.Service) error

	mu      sync.Mutex
	loaded  bool
	state   map[string]object // last good objects by key
	files   int
	lastSum [sha256.Size]byte // content of the last read, good or bad
	lastBad string            // message of the last error, to report it once
	stats   Stats
	lastErr error
}

// Stats is a snapshot of a Source's counters.
type Stats struct {
	// Loads counts the reads that were applied (the first load included).
	Loads uint64
	// Errors counts the failed reads; one bad content is counted once.
	Errors uint64
	// LastError is the error of the last read, "" once a read succeeds.
	LastError     string
	LastErrorTime time.Time
	// LastLoadTime is when the last good read was applied.
	LastLoadTime time.Time
	// Files, Services and EndpointSlices describe the last good state.
	Files, Services, EndpointSlices int
	// Watching is true while Run has fsnotify watches (false: polling only).
	Watching bool
}

// New returns a Source for path (a file or a directory) that delivers to h.
// It reads nothing yet: call Load, then Run. A nil logger logs nothing.
func New(path string, h service.Handler, logger *zap.Logger, opts ...Option) *Source {
	if logger == nil {
		logger = zap.NewNop()
	}
	s := &Source{
		path:     path,
		h:        h,
		log:      logger.Named("file-source").With(zap.String("path", path)),
		clock:    service.RealClock(),
		poll:     DefaultPollInterval,
		debounce: DefaultDebounce,
		notify:   true,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Load reads the path and delivers its objects, then OnSynced. It is the
// start-up read: on error nothing is delivered and the error names the file,
// the document and the field (a *DecodeError where the problem is in a
// document). Once a Load succeeded, Load behaves as Reload.
func (s *Source) Load() error {
	return s.load()
}

// Reload reads the path again and delivers the difference to the last good
// state. On error the last good state stays; the error is logged once per
// distinct problem, counted, and returned by LastError until a read
// succeeds. Reading unchanged content does nothing.
func (s *Source) Reload() error {
	return s.load()
}

// LastError returns the error of the last read, nil if it succeeded; for
// health checks.
func (s *Source) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// Stats returns a snapshot of the counters.
func (s *Source) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Source) load() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	objs, nfiles, sum, err := s.read()
	if err == nil && s.loaded && sum == s.lastSum {
		return nil
	}
	if err != nil {
		if !s.loaded {
			// Start-up: the caller reports it; there is nothing to keep.
			s.setError(err)
			return err
		}
		if err.Error() != s.lastBad {
			s.lastBad = err.Error()
			s.setError(err)
			s.log.Error("configuration reload failed; keeping the last good state", zap.Error(err))
		}
		s.lastSum = sum
		s.lastErr = err
		return err
	}
	first := !s.loaded
	s.apply(objs)
	s.loaded = true
	s.files = nfiles
	s.lastSum = sum
	s.lastBad = ""
	s.lastErr = nil
	s.stats.Loads++
	s.stats.LastError = ""
	s.stats.LastLoadTime = s.clock.Now()
	s.stats.Files = nfiles
	s.stats.Services, s.stats.EndpointSlices = 0, 0
	for _, o := range s.state {
		if o.svc != nil {
			s.stats.Services++
		} else {
			s.stats.EndpointSlices++
		}
	}
	if nfiles == 0 {
		s.log.Warn("the configuration directory has no files: no Service is served until one appears (.yaml, .yml or .json; names starting with a dot are skipped)")
	}
	if first {
		s.h.OnSynced()
		s.log.Info("configuration loaded", zap.Int("files", nfiles),
			zap.Int("services", s.stats.Services), zap.Int("endpointSlices", s.stats.EndpointSlices))
	} else {
		s.log.Info("configuration reloaded", zap.Int("files", nfiles),
			zap.Int("services", s.stats.Services), zap.Int("endpointSlices", s.stats.EndpointSlices))
	}
	return nil
}

func (s *Source) setError(err error) {
	s.lastErr = err
	s.stats.Errors++
	s.stats.LastError = err.Error()
	s.stats.LastErrorTime = s.clock.Now()
}

// read returns the objects of every file, keyed, and a digest of the
// content read (names and bytes), which is set even when decoding fails.
func (s *Source) read() (map[string]object, int, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	files, err := listFiles(s.path)
	if err != nil {
		return nil, 0, sum, fmt.Errorf("reading %s: %w", s.path, err)
	}
	h := sha256.New()
	objs := make(map[string]object)
	var decodeErr error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, 0, sum, fmt.Errorf("reading %s: %w", f, err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(data))
		h.Write(data)
		if decodeErr != nil {
			continue // keep hashing, so an unchanged bad state is recognized
		}
		if len(data) == 0 {
			// On a reload most likely caught between truncate and write:
			// taking it at its word would delete every service it held.
			// Refused at start too, so that a file is read the same way
			// whenever it is read.
			decodeErr = fmt.Errorf("%s: empty file (or one being written): to mean no objects, leave a comment in it (# none)", f)
			continue
		}
		got, err := decodeFile(f, data)
		if err != nil {
			decodeErr = err
			continue
		}
		for _, o := range got {
			if o.svc != nil && s.checkSvc != nil {
				if err := s.checkSvc(o.svc); err != nil {
					decodeErr = fmt.Errorf("%s: %s: %w", o.where, o.key, err)
					break
				}
			}
			if prev, dup := objs[o.key]; dup {
				decodeErr = fmt.Errorf("%s: %s is defined twice (first in %s)", o.where, o.key, prev.where)
				break
			}
			objs[o.key] = o
		}
	}
	copy(sum[:], h.Sum(nil))
	if decodeErr != nil {
		return nil, len(files), sum, decodeErr
	}
	return objs, len(files), sum, nil
}

// apply delivers the difference between the last good state and next:
// deletes, then updates, then adds, each in key order. Called with mu held.
func (s *Source) apply(next map[string]object) {
	var deleted, updated, added []string
	for k := range s.state {
		if _, ok := next[k]; !ok {
			deleted = append(deleted, k)
		}
	}
	for k, o := range next {
		old, ok := s.state[k]
		switch {
		case !ok:
			added = append(added, k)
		case !sameObject(old, o):
			updated = append(updated, k)
		}
	}
	sort.Strings(deleted)
	sort.Strings(updated)
	sort.Strings(added)
	for _, k := range deleted {
		o := s.state[k]
		if o.svc != nil {
			s.h.OnServiceDelete(o.svc)
		} else {
			s.h.OnEndpointSliceDelete(o.slice)
		}
	}
	for _, k := range updated {
		old, o := s.state[k], next[k]
		if o.svc != nil {
			s.h.OnServiceUpdate(old.svc, o.svc)
		} else {
			s.h.OnEndpointSliceUpdate(old.slice, o.slice)
		}
	}
	for _, k := range added {
		o := next[k]
		if o.svc != nil {
			s.h.OnServiceAdd(o.svc)
		} else {
			s.h.OnEndpointSliceAdd(o.slice)
		}
	}
	if s.loaded && len(deleted)+len(updated)+len(added) > 0 {
		s.log.Debug("configuration changes delivered", zap.Int("deleted", len(deleted)),
			zap.Int("updated", len(updated)), zap.Int("added", len(added)))
	}
	s.state = next
}

func sameObject(a, b object) bool {
	if a.svc != nil {
		return reflect.DeepEqual(a.svc, b.svc)
	}
	return reflect.DeepEqual(a.slice, b.slice)
}

// Run loads the path if Load has not succeeded yet (returning its error),
// then watches it and reloads on change until ctx is done. It returns nil
// when ctx ends. Reload errors do not end it.
func (s *Source) Run(ctx context.Context) error {
	s.mu.Lock()
	loaded := s.loaded
	s.mu.Unlock()
	if !loaded {
		if err := s.Load(); err != nil {
			return err
		}
	}

	// Timer callbacks only signal; the reload runs in this goroutine.
	reloadC := make(chan struct{}, 1)
	pollC := make(chan struct{}, 1)
	signal := func(c chan struct{}) func() {
		return func() {
			select {
			case c <- struct{}{}:
			default:
			}
		}
	}

	var events chan fsnotify.Event
	var errs chan error
	if w := s.watch(); w != nil {
		defer w.Close()
		events, errs = w.Events, w.Errors
		defer s.setWatching(false)
	}

	var pollTimer, debounceTimer service.Timer
	armPoll := func() {
		if s.poll > 0 {
			pollTimer = s.clock.AfterFunc(s.poll, signal(pollC))
		}
	}
	armPoll()
	defer func() {
		if pollTimer != nil {
			pollTimer.Stop()
		}
		if debounceTimer != nil {
			debounceTimer.Stop()
		}
	}()

	watchErrLogged := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			s.log.Debug("file event", zap.String("name", ev.Name), zap.String("op", ev.Op.String()))
			if debounceTimer == nil {
				debounceTimer = s.clock.AfterFunc(s.debounce, signal(reloadC))
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			if !watchErrLogged {
				watchErrLogged = true
				s.log.Warn("file watch error; polling still reloads", zap.Error(err))
			}
		case <-reloadC:
			debounceTimer = nil
			_ = s.Reload() // logged and recorded by Reload
		case <-pollC:
			_ = s.Reload()
			armPoll()
		}
	}
}

// watch starts fsnotify on the path's directory (for a file: the directory
// holding it, and the one holding its symlink target). It returns nil, after
// logging why, when notifications are off or unavailable.
func (s *Source) watch() *fsnotify.Watcher {
	if !s.notify {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		s.log.Warn("file notifications unavailable; polling only", zap.Error(err), zap.Duration("interval", s.poll))
		return nil
	}
	dirs := []string{s.path}
	if fi, err := os.Stat(s.path); err == nil && !fi.IsDir() {
		dirs = []string{filepath.Dir(s.path)}
		if real, err := filepath.EvalSymlinks(s.path); err == nil && filepath.Dir(real) != dirs[0] {
			dirs = append(dirs, filepath.Dir(real))
		}
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			w.Close()
			s.log.Warn("cannot watch; polling only", zap.String("dir", d), zap.Error(err), zap.Duration("interval", s.poll))
			return nil
		}
	}
	s.setWatching(true)
	return w
}

func (s *Source) setWatching(on bool) {
	s.mu.Lock()
	s.stats.Watching = on
	s.mu.Unlock()
}
