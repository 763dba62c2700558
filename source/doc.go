// Package source is the parent of the places Kubernetes objects come from:
// source/kube (client-go informers against an API server) and source/file
// (YAML or JSON files of the same objects, reloaded on change). Both deliver
// objects to the same service.Tracker handlers.
//
// Sources may import service and nothing else of userproxy.
package source
