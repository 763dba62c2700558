package service

// Events: the Handler the sources call, and what each event marks for the
// next build.
//
// 1. An On* handler hands the object to setService or setSlice (a slice that
//    moved to another service first leaves its old one).
// 2. setService and setSlice convert it (newSvcInfo, newSliceInfo) and store
//    it in the service's state; an object that changed nothing stops here.
// 3. markDirty queues the service for the next build, with the time of the
//    change for the latency metric.
// 4. kick (build.go) builds at once or arms the coalescing timer. OnSynced
//    marks nothing: it allows the first build, and kicks.

import (
	"reflect"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Handler receives Service and EndpointSlice events. Both sources (kube,
// file) call it; Tracker implements it. The shape is kube-proxy's
// ServiceHandler and EndpointSliceHandler (pkg/proxy/config/config.go) with
// one OnSynced for both kinds.
//
// Contract for callers: objects passed in are read-only to the handler and
// to the caller for as long as the call lasts; calls may come from several
// goroutines at once; OnSynced is called once, after every object that
// existed at start has been delivered.
type Handler interface {
	OnServiceAdd(svc *v1.Service)
	OnServiceUpdate(oldSvc, svc *v1.Service)
	OnServiceDelete(svc *v1.Service)
	OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice)
	OnEndpointSliceUpdate(oldSlice, slice *discoveryv1.EndpointSlice)
	OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice)
	OnSynced()
}

var _ Handler = (*Tracker)(nil)

// OnServiceAdd implements Handler.
func (t *Tracker) OnServiceAdd(svc *v1.Service) { t.setService(svc, false) }

// OnServiceUpdate implements Handler.
func (t *Tracker) OnServiceUpdate(_, svc *v1.Service) { t.setService(svc, false) }

// OnServiceDelete implements Handler.
func (t *Tracker) OnServiceDelete(svc *v1.Service) { t.setService(svc, true) }

// OnEndpointSliceAdd implements Handler.
func (t *Tracker) OnEndpointSliceAdd(es *discoveryv1.EndpointSlice) { t.setSlice(es, false) }

// OnEndpointSliceUpdate implements Handler. A slice whose service label
// changed leaves its old service.
func (t *Tracker) OnEndpointSliceUpdate(old, es *discoveryv1.EndpointSlice) {
	if old != nil {
		oldSvc, okOld := sliceKey(old)
		newSvc, okNew := sliceKey(es)
		if okOld && (!okNew || oldSvc != newSvc) {
			t.setSlice(old, true)
		}
	}
	t.setSlice(es, false)
}

// OnEndpointSliceDelete implements Handler.
func (t *Tracker) OnEndpointSliceDelete(es *discoveryv1.EndpointSlice) { t.setSlice(es, true) }

// OnSynced implements Handler: the first table is built now.
func (t *Tracker) OnSynced() {
	t.mu.Lock()
	t.synced = true
	t.mu.Unlock()
	t.kick()
}

func (t *Tracker) setService(svc *v1.Service, remove bool) {
	if svc == nil {
		return
	}
	name := ServiceName{svc.Namespace, svc.Name}
	var info *svcInfo
	if !remove {
		info = newSvcInfo(svc, t.checkScheduler)
	}
	now := t.clock.Now()
	t.mu.Lock()
	t.stats.ServiceChanges++
	st := t.services[name]
	if st == nil {
		if remove {
			t.mu.Unlock()
			return
		}
		st = &svcState{}
		t.services[name] = st
	}
	if reflect.DeepEqual(st.info, info) {
		t.mu.Unlock()
		return
	}
	fams := clusterIPFamilies(st.info) | clusterIPFamilies(info)
	st.info = info
	st.serviceChanged = true
	t.markDirty(name, st, now, now, fams)
	t.mu.Unlock()
	t.kick()
}

func (t *Tracker) setSlice(es *discoveryv1.EndpointSlice, remove bool) {
	if es == nil {
		return
	}
	name, ok := sliceKey(es)
	var info *sliceInfo
	if ok && !remove {
		info = newSliceInfo(es)
		ok = info != nil
	}
	now := t.clock.Now()
	t.mu.Lock()
	if !ok {
		t.stats.IgnoredEndpointSlices++
		t.mu.Unlock()
		return
	}
	t.stats.EndpointChanges++
	st := t.services[name]
	if st == nil {
		if remove {
			t.mu.Unlock()
			return
		}
		st = &svcState{}
		t.services[name] = st
	}
	i, had := slices.BinarySearchFunc(st.slices, es.Name, func(s *sliceInfo, name string) int { return cmpString(s.name, name) })
	switch {
	case remove && !had:
		t.mu.Unlock()
		return
	case remove:
		info = st.slices[i]
		st.slices = slices.Delete(st.slices, i, i+1)
	case had && reflect.DeepEqual(st.slices[i], info):
		t.mu.Unlock()
		return
	default:
		if had {
			st.slices[i] = info
		} else {
			st.slices = slices.Insert(st.slices, i, info)
		}
	}
	changed := now
	if tt := triggerTime(es); !remove && !tt.IsZero() && !tt.Before(t.start) {
		changed = tt
	}
	st.slicesChanged = true
	t.markDirty(name, st, now, changed, familySetOf(info.family))
	t.mu.Unlock()
	t.kick()
}

// maxTriggers bounds the latency samples kept per service between builds.
const maxTriggers = 64

// markDirty queues a service for the next build at now, with the time of
// the change and its families for the latency metric. Called with mu held.
func (t *Tracker) markDirty(name ServiceName, st *svcState, now, changed time.Time, fams familySet) {
	if !st.dirty {
		st.dirty = true
		t.dirty = append(t.dirty, name)
	}
	if t.published && t.oldestPending.IsZero() {
		t.oldestPending = now
	}
	t.stats.LastQueuedTime = now
	if t.published && len(st.triggers) < maxTriggers {
		st.triggers = append(st.triggers, trigger{changed, fams})
	}
}

// clusterIPFamilies returns the families of info's ClusterIPs (none for
// nil).
func clusterIPFamilies(info *svcInfo) familySet {
	var fams familySet
	if info != nil {
		for _, ip := range info.clusterIPs {
			fams |= familySetOf(familyOf(ip))
		}
	}
	return fams
}
