// Package file reads Services and EndpointSlices from YAML or JSON files (a
// file or a directory; multi-document streams and v1 Lists, as
// `kubectl get svc,endpointslices -o yaml` prints them; JSON documents, one
// or several, also between YAML's "---" lines, as concatenated
// `kubectl get -o json` outputs are), decodes them
// strictly (an unknown field is an error naming the file, the document and
// the field), validates them, and reloads on change (fsnotify, with polling
// as a fallback), delivering only the difference to a service.Handler. A bad
// reload keeps the last good state, is logged once, counted, and readable
// with LastError for health checks.
//
// Callers: cmd (`userproxy run --config FILE|DIR`).
//
// It may import service and nothing else of userproxy.
package file
