// Package file reads Services and EndpointSlices from YAML or JSON files (a
// file or a directory; multi-document streams and v1 Lists, as
// `kubectl get -o yaml` prints them), decodes them strictly, and reloads on
// change, delivering only the difference to a service.Tracker. A bad reload
// keeps the last good state.
//
// It may import service and nothing else of userproxy.
package file
