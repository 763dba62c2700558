package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/userproxy/userproxy/service"
)

// The life of a Source (Run):
//
//  1. two shared informers, resync off: Services filtered by
//     ServiceSelector, EndpointSlices by EndpointSliceSelector (each says
//     how that differs from kube-proxy's informers); their list and watch
//     calls go through observe, which tracks whether the API server
//     answers (a watch answers once it delivers an event or stays open a
//     second: observeWatch);
//  2. informer events go to the handler (pkg/proxy/config/config.go);
//  3. once both handler registrations have synced, OnSynced, once;
//  4. while the API server is unreachable the informers retry with
//     back-off, the handler hears nothing and the last table keeps
//     serving; the outage is logged when it starts and when it ends, not
//     per retry;
//  5. when ctx ends the informers stop and Run returns after they have.

// LabelServiceProxyName is the label that hands a Service to another
// service proxy (kube-proxy's apis.LabelServiceProxyName).
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// ServiceSelector is the label selector of the Service informer: a Service
// that asks for another service proxy is not watched, as kube-proxy does not
// watch it (labelSelectorNoProxyName in cmd/kube-proxy/app/server.go).
// kube-proxy also leaves headless Services out with a field selector
// (spec.clusterIP!=None); we watch them, for cluster DNS, and the Tracker
// does not proxy them (service.ReasonHeadless, kube-proxy's
// ShouldSkipService).
const ServiceSelector = "!" + LabelServiceProxyName

// EndpointSliceSelector is the label selector of the EndpointSlice
// informer: none, every slice is watched. kube-proxy leaves out the slices
// labelled service.kubernetes.io/headless (labelSelectorNoHeadlessEndpoints),
// the label the EndpointSlice controller puts on every slice of a headless
// Service — the very slices cluster DNS answers a headless name from. So we
// watch them and the Tracker keeps them out of the datapath instead, which
// the datapath cannot tell from kube-proxy's filter. Like kube-proxy we watch
// the slices of a Service handed to another proxy (the controller copies the
// label onto them); they serve nothing without their Service.
const EndpointSliceSelector = ""

// Source delivers the Services and EndpointSlices of a cluster to a
// service.Handler. The handler is called from the informers' goroutines,
// Services and EndpointSlices concurrently; objects are shared with the
// informer caches and must not be modified.
type Source struct {
	client kubernetes.Interface
	h      service.Handler
	log    *zap.Logger
	now    func() time.Time

	synced atomic.Bool

	mu        sync.Mutex
	connected bool
	since     time.Time // start of the current outage
	lastErr   error     // last error observed (nil when connected)
	outageErr int       // errors seen during the current outage
	stats     Stats
}

// Stats is a snapshot of a Source's connection state.
type Stats struct {
	// Synced is true once both caches synced and OnSynced was called.
	Synced bool
	// Connected is false from a failed list or watch until one succeeds.
	Connected bool
	// DisconnectedSince is the start of the current outage (zero when
	// connected).
	DisconnectedSince time.Time
	// Outages counts the times the API server became unreachable.
	Outages uint64
	// Errors counts failed list and watch calls, every retry included.
	Errors uint64
	// LastError is the last error observed, kept after recovery.
	LastError     string
	LastErrorTime time.Time
}

// Option configures a Source.
type Option func(*Source)

// WithNow sets the time source of Stats and outage durations (default
// time.Now).
func WithNow(now func() time.Time) Option { return func(s *Source) { s.now = now } }

// New returns a Source reading from client (a real or a fake clientset)
// into h. A nil logger logs nothing.
func New(client kubernetes.Interface, h service.Handler, logger *zap.Logger, opts ...Option) *Source {
	if logger == nil {
		logger = zap.NewNop()
	}
	s := &Source{
		client:    client,
		h:         h,
		log:       logger.Named("kube-source"),
		now:       time.Now,
		connected: true,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Synced reports whether OnSynced has been delivered.
func (s *Source) Synced() bool { return s.synced.Load() }

// LastError returns the error of the current outage, nil while the API
// server answers; for health checks.
func (s *Source) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connected {
		return nil
	}
	return s.lastErr
}

// Stats returns a snapshot of the connection state.
func (s *Source) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Synced = s.synced.Load()
	st.Connected = s.connected
	if !s.connected {
		st.DisconnectedSince = s.since
	}
	return st
}

// Run starts the informers, delivers events until ctx ends, and returns
// once the informers have stopped. It returns nil when ctx ends, also before
// the caches synced (then OnSynced is never called). Run may be called once.
func (s *Source) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, klogToZap(s.log)))
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()

	svcInf := s.informer(&v1.Service{}, "services", ServiceSelector,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return s.client.CoreV1().Services(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return s.client.CoreV1().Services(metav1.NamespaceAll).Watch(ctx, o)
		})
	sliceInf := s.informer(&discoveryv1.EndpointSlice{}, "endpointslices", EndpointSliceSelector,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return s.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return s.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
		})

	svcReg, err := svcInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if svc, ok := obj.(*v1.Service); ok {
				s.h.OnServiceAdd(svc)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*v1.Service)
			n, ok2 := newObj.(*v1.Service)
			if ok1 && ok2 {
				s.h.OnServiceUpdate(o, n)
			}
		},
		DeleteFunc: func(obj any) {
			if svc, ok := tombstone(obj).(*v1.Service); ok {
				s.h.OnServiceDelete(svc)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("service informer: %w", err)
	}
	sliceReg, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if es, ok := obj.(*discoveryv1.EndpointSlice); ok {
				s.h.OnEndpointSliceAdd(es)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*discoveryv1.EndpointSlice)
			n, ok2 := newObj.(*discoveryv1.EndpointSlice)
			if ok1 && ok2 {
				s.h.OnEndpointSliceUpdate(o, n)
			}
		},
		DeleteFunc: func(obj any) {
			if es, ok := tombstone(obj).(*discoveryv1.EndpointSlice); ok {
				s.h.OnEndpointSliceDelete(es)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("endpointslice informer: %w", err)
	}

	wg.Go(func() { svcInf.RunWithContext(ctx) })
	wg.Go(func() { sliceInf.RunWithContext(ctx) })

	s.log.Info("waiting for the Service and EndpointSlice caches to sync",
		zap.String("serviceSelector", ServiceSelector), zap.String("endpointSliceSelector", EndpointSliceSelector))
	if !cache.WaitForCacheSync(ctx.Done(), svcReg.HasSynced, sliceReg.HasSynced) {
		return nil // ctx ended first
	}
	s.synced.Store(true)
	s.h.OnSynced()
	// In kube-proxy's words (client-go's WaitForNamedCacheSync, under
	// pkg/proxy/config's controller names), for the parsers that wait
	// for them.
	s.log.Info("Caches are synced", zap.String("controller", "service config"))
	s.log.Info("Caches are synced", zap.String("controller", "endpoint slice config"))
	<-ctx.Done()
	return nil
}

// informer builds a shared informer whose list and watch calls carry the
// label selector and report to observe.
func (s *Source) informer(example runtime.Object, resource, selector string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			obj, err := list(ctx, o)
			s.observe(ctx, resource, "list", err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			w, err := watchFn(ctx, o)
			if err != nil {
				s.observe(ctx, resource, "watch", err)
				return w, err
			}
			return s.observeWatch(ctx, resource, w), nil
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(
		cache.ToListWatcherWithWatchListSemantics(lw, s.client),
		example,
		cache.SharedIndexInformerOptions{ResyncPeriod: 0},
	)
	// Replaces client-go's default handler, which logs every failure.
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		s.watchError(ctx, resource, err)
	})
	return inf
}

// tombstone unwraps the object of a delete event whose final state the
// informer missed.
func tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// observe records the outcome of a list or watch call.
func (s *Source) observe(ctx context.Context, resource, op string, err error) {
	if err == nil {
		s.reachable()
		return
	}
	if ctx.Err() != nil {
		return // stopping
	}
	s.unreachable(resource, op, err)
}

// errEmptyWatch is what a watch that closed at once without an event is
// taken for.
var errEmptyWatch = errors.New("watch closed at once without an event: the API server did not answer " +
	"(client-go returns an empty watch and no error when its retries of a reset connection run out)")

// veryShortWatch is how long a watch must stay open, or how soon it must
// deliver an event, to count as an answer from the API server (client-go's
// reflector uses the same second for its "very short watch").
const veryShortWatch = time.Second

// observeWatch returns w with its events passed through a goroutine that
// tells observe what the watch call itself cannot: when retries of a reset
// connection run out, client-go's Watch returns an empty, already closed
// watch and no error (rest.Request.Watch), and the informers then retry for
// ever without an error reaching anyone. That is what a stopped API server
// behind a load balancer or proxy looks like. So a watch counts as an answer
// only once it delivers an event or stays open veryShortWatch; closing
// sooner without an event counts as a failed call.
func (s *Source) observeWatch(ctx context.Context, resource string, w watch.Interface) watch.Interface {
	ow := &observedWatch{inner: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go ow.pump(ctx, s, resource)
	return ow
}

// observedWatch is a watch.Interface in front of another.
type observedWatch struct {
	inner watch.Interface
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func (w *observedWatch) ResultChan() <-chan watch.Event { return w.out }

// Stop stops the inner watch; the pump then closes ResultChan.
func (w *observedWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.inner.Stop()
	})
}

func (w *observedWatch) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

func (w *observedWatch) pump(ctx context.Context, s *Source, resource string) { // watch pump: inner events -> informer, judging the call
	defer close(w.out)
	in := w.inner.ResultChan()
	settle := time.NewTimer(veryShortWatch)
	defer settle.Stop()
	judged := false
	for {
		select {
		case ev, ok := <-in:
			if !ok {
				if !judged && !w.stopped() {
					s.observe(ctx, resource, "watch", errEmptyWatch)
				}
				return
			}
			if !judged {
				judged = true
				s.reachable()
			}
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
		case <-settle.C:
			if !judged {
				judged = true
				s.reachable()
			}
		case <-w.stop:
			return
		}
	}
}

// watchError is the informers' watch error handler: it sees what ended a
// ListAndWatch cycle. Expired resource versions and closed streams are
// routine; an error observe already counted is not counted twice.
func (s *Source) watchError(ctx context.Context, resource string, err error) {
	if ctx.Err() != nil {
		return
	}
	switch {
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, io.EOF):
		s.log.Debug("watch closed", zap.String("resource", resource), zap.Error(err))
		return
	}
	s.mu.Lock()
	seen := s.lastErr != nil && errors.Is(err, s.lastErr)
	s.mu.Unlock()
	if seen {
		return
	}
	s.unreachable(resource, "watch", err)
}

func (s *Source) unreachable(resource, op string, err error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Errors++
	s.stats.LastError = err.Error()
	s.stats.LastErrorTime = now
	s.lastErr = err
	s.outageErr++
	if !s.connected {
		s.log.Debug("API server still unreachable", zap.String("resource", resource), zap.String("call", op), zap.Error(err))
		return
	}
	s.connected = false
	s.since = now
	s.outageErr = 1
	s.stats.Outages++
	s.log.Warn("Kubernetes API server unreachable; serving the last known services until it answers again",
		zap.String("resource", resource), zap.String("call", op), zap.Error(err))
}

func (s *Source) reachable() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.connected {
		return
	}
	s.connected = true
	s.log.Info("Kubernetes API server reachable again",
		zap.Duration("outage", s.now().Sub(s.since)), zap.Int("failedCalls", s.outageErr))
	s.lastErr = nil
}
