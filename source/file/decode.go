package file

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/service"
)

// This file reads a file or a directory into objects:
//
//  1. list the files (a directory: its *.yaml, *.yml and *.json files, not
//     hidden, not recursive, in name order),
//  2. split each file into documents, remembering the line each starts on:
//     at YAML's "---" and "..." lines, then each document that opens with
//     '{' or '[' into the JSON values it holds — one, or several back to
//     back as a JSON stream. So concatenated `kubectl get -o json` outputs
//     load with or without "---" lines between them, in a .yaml, .yml or
//     .json file (a JSON value is a YAML flow node; "---" is never valid
//     JSON, so the split never cuts through one). Such a document that is
//     not JSON is flow-style YAML, decoded as YAML — except in a .json
//     file, where it is invalid JSON,
//  3. decode each document strictly by its apiVersion and kind: a Service,
//     an EndpointSlice, or a List (v1 List, ServiceList, EndpointSliceList)
//     of them, as `kubectl get svc,endpointslices -o yaml` prints,
//  4. validate each object (service.ValidateService,
//     service.ValidateEndpointSlice).
//
// Every error says where: file, document, line, list item, object, field.

// DecodeError is a problem with one document of a configuration file.
type DecodeError struct {
	// File is the file's path.
	File string
	// Document is the document's number in the file, from 1.
	Document int
	// Line is the line the document starts on, from 1.
	Line int
	// FieldLine is the line of the offending field (YAML), or of the
	// YAML error, when it is known; else 0.
	FieldLine int
	// Item is the index in a List's items, or -1.
	Item int
	// Object names the object ("Service ns/name") when it is known.
	Object string
	// Field is the path of the offending field when there is one.
	Field string
	// Err is the problem.
	Err error
}

// Error reads like `svc.yaml:17: document 2 (line 14): items[3]: Service
// default/web: spec.clusterIP: Invalid value: "x": must be a valid IP
// address`: the file and the line of the field (the document's first when
// the field's is not known), as compilers write them, then the document.
func (e *DecodeError) Error() string {
	var b strings.Builder
	line := e.Line
	if e.FieldLine > 0 {
		line = e.FieldLine
	}
	fmt.Fprintf(&b, "%s:%d: document %d (line %d)", e.File, line, e.Document, e.Line)
	if e.Item >= 0 {
		fmt.Fprintf(&b, ": items[%d]", e.Item)
	}
	if e.Object != "" {
		b.WriteString(": " + e.Object)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *DecodeError) Unwrap() error { return e.Err }

// object is one Service or EndpointSlice read from a file.
type object struct {
	key   string // "Service ns/name" or "EndpointSlice ns/name"
	where string // file, document and item, for duplicate reports
	svc   *v1.Service
	slice *discoveryv1.EndpointSlice
}

// listFiles returns the files that path names: itself, or the config files
// of the directory.
func listFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		switch strings.ToLower(filepath.Ext(name)) {
		case ".yaml", ".yml", ".json":
		default:
			continue
		}
		full := filepath.Join(path, name)
		st, err := os.Stat(full) // follows symlinks, as ConfigMap volumes use them
		if err != nil {
			return nil, err
		}
		if st.Mode().IsRegular() {
			files = append(files, full)
		}
	}
	sort.Strings(files)
	return files, nil
}

// document is one YAML or JSON document of a file.
type document struct {
	n    int // from 1
	line int // from 1, the first line that is not blank or a comment
	// first is the file line of data's first line (YAML).
	first int
	data  []byte
	json  bool
}

// lastLine is the file line of d's last line. The YAML parser counts a
// lone carriage return as a line break; an editor, and this file:line,
// count newlines only: a line the parser names past it is its last.
func (d *document) lastLine() int {
	return d.first + bytes.Count(bytes.TrimSuffix(d.data, []byte("\n")), []byte("\n"))
}

// byteOrderMark may open a file written by an editor that adds one; YAML
// ignores it, JSON does not allow it.
var byteOrderMark = []byte("\ufeff")

// splitDocuments cuts a file into its non-empty documents: YAML documents
// at their markers, and the JSON values of each that opens with '{' or '['
// (step 2 above). jsonFile (a .json file) refuses such a document that is
// not JSON instead of decoding it as YAML.
func splitDocuments(data []byte, jsonFile bool) ([]document, error) {
	var out []document
	add := func(d document) {
		d.n = len(out) + 1
		out = append(out, d)
	}
	for _, d := range splitYAML(bytes.TrimPrefix(data, byteOrderMark)) {
		off, ok := jsonStart(d)
		if !ok {
			add(d)
			continue
		}
		values, err := splitJSON(d.data[off:], d.line)
		switch {
		case err == nil:
			for _, v := range values {
				add(v)
			}
		case jsonFile:
			err.Document = len(out) + len(values) + 1
			return nil, err
		default:
			add(d) // flow-style YAML, or bad input YAML's error will place
		}
	}
	return out, nil
}

// jsonStart returns the offset in d.data of the first byte of its first
// line that is not blank or a comment, and whether that byte opens a JSON
// object or array.
func jsonStart(d document) (int, bool) {
	off := 0
	for range d.line - d.first { // the blank and comment lines before it
		off += bytes.IndexByte(d.data[off:], '\n') + 1
	}
	for off < len(d.data) && (d.data[off] == ' ' || d.data[off] == '\t') {
		off++
	}
	return off, off < len(d.data) && (d.data[off] == '{' || d.data[off] == '[')
}

// splitYAML splits at lines starting with "---" (alone, or followed by a
// space or tab) and at "..." end markers; documents holding only blank
// lines and comments are dropped. A document's line is that of its first
// line that is not blank or a comment.
func splitYAML(data []byte) []document {
	var docs []document
	var cur bytes.Buffer
	start, line := 1, 0
	flush := func() {
		if skip, ok := firstContentLine(cur.Bytes()); ok {
			docs = append(docs, document{n: len(docs) + 1, line: start + skip, first: start, data: append([]byte(nil), cur.Bytes()...)})
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), len(data)+1)
	for sc.Scan() {
		line++
		l := sc.Text()
		switch {
		case l == "---" || strings.HasPrefix(l, "--- ") || strings.HasPrefix(l, "---\t"):
			flush()
			start = line
			if rest := strings.TrimSpace(l[3:]); rest != "" && !strings.HasPrefix(rest, "#") {
				cur.WriteString(rest + "\n")
			} else {
				start = line + 1
			}
		case l == "...":
			flush()
			start = line + 1
		default:
			cur.WriteString(l)
			cur.WriteByte('\n')
		}
	}
	flush()
	return docs
}

// firstContentLine returns how many blank and comment lines open b, and
// whether b has any other line.
func firstContentLine(b []byte) (int, bool) {
	for i, l := range bytes.Split(b, []byte("\n")) {
		l = bytes.TrimSpace(l)
		if len(l) > 0 && l[0] != '#' {
			return i, true
		}
	}
	return 0, false
}

// splitJSON reads a stream of JSON values, the first of which starts on
// file line first. On an error it returns the values before the bad one and
// a DecodeError whose Document counts from 1 within data.
func splitJSON(data []byte, first int) ([]document, *DecodeError) {
	var docs []document
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		// Skip white space to find where the next value starts.
		off := int(dec.InputOffset())
		for off < len(data) && strings.IndexByte(" \t\r\n", data[off]) >= 0 {
			off++
		}
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		line := first + bytes.Count(data[:off], []byte("\n"))
		if err != nil {
			return docs, &DecodeError{Document: len(docs) + 1, Line: line, Item: -1, Err: fmt.Errorf("invalid JSON: %w", err)}
		}
		docs = append(docs, document{n: len(docs) + 1, line: line, first: line, data: raw, json: true})
	}
}

// decodeFile returns the objects of one file.
func decodeFile(name string, data []byte) ([]object, error) {
	docs, err := splitDocuments(data, strings.EqualFold(filepath.Ext(name), ".json"))
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			de.File = name
		}
		return nil, err
	}
	var out []object
	for _, d := range docs {
		fail := func(item int, objName string, err error) error {
			e := &DecodeError{File: name, Document: d.n, Line: d.line, Item: item, Object: objName, Err: err}
			e.Field = fieldOf(err)
			if e.Field != "" && !d.json {
				if l := fieldLine(d.data, item, e.Field); l > 0 {
					e.FieldLine = min(l+d.first-1, d.lastLine())
				}
			}
			return e
		}
		js := d.data
		if !d.json {
			js, err = yaml.YAMLToJSONStrict(d.data)
			if err != nil {
				msg := fileLines(err.Error(), d.first)
				e := &DecodeError{File: name, Document: d.n, Line: d.line, Item: -1, Err: fmt.Errorf("invalid YAML: %s", msg)}
				if m := yamlLine.FindStringSubmatch(msg); m != nil {
					// The parser names the line after the last for an
					// error at the end of the stream: the document's
					// last line is where to look.
					n, _ := strconv.Atoi(m[1])
					e.FieldLine = min(n, d.lastLine())
				}
				return nil, e
			}
		}
		if bytes.Equal(bytes.TrimSpace(js), []byte("null")) {
			continue
		}
		objs, err := decodeDocument(js, fail)
		if err != nil {
			return nil, err
		}
		for i := range objs {
			objs[i].where = fmt.Sprintf("%s: document %d (line %d)", name, d.n, d.line)
		}
		out = append(out, objs...)
	}
	return out, nil
}

var yamlLine = regexp.MustCompile(`\bline (\d+)`)

// fileLines rewrites the "line N" of a YAML error, counted from the
// document's first line, into a line of the file.
func fileLines(msg string, first int) string {
	return yamlLine.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(m[len("line "):])
		if err != nil {
			return m
		}
		return "line " + strconv.Itoa(n+first-1)
	})
}

type typeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

type failFunc func(item int, objName string, err error) error

// decodeDocument decodes a Service, an EndpointSlice or a List of them.
func decodeDocument(js []byte, fail failFunc) ([]object, error) {
	var tm typeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return nil, fail(-1, "", errors.New("a document must be an object with apiVersion and kind"))
	}
	switch {
	case tm.APIVersion == "v1" && tm.Kind == "List",
		tm.APIVersion == "v1" && tm.Kind == "ServiceList",
		tm.APIVersion == "discovery.k8s.io/v1" && tm.Kind == "EndpointSliceList":
		var list struct {
			typeMeta `json:",inline"`
			Metadata json.RawMessage   `json:"metadata,omitempty"`
			Items    []json.RawMessage `json:"items"`
		}
		if err := strict(js, &list); err != nil {
			return nil, fail(-1, tm.Kind, err)
		}
		// Items of a typed list may leave their kind out.
		var def typeMeta
		switch tm.Kind {
		case "ServiceList":
			def = typeMeta{APIVersion: "v1", Kind: "Service"}
		case "EndpointSliceList":
			def = typeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		}
		var out []object
		for i, item := range list.Items {
			o, err := decodeObject(item, def, func(err error, objName string) error { return fail(i, objName, err) })
			if err != nil {
				return nil, err
			}
			out = append(out, o)
		}
		return out, nil
	}
	o, err := decodeObject(js, typeMeta{}, func(err error, objName string) error { return fail(-1, objName, err) })
	if err != nil {
		return nil, err
	}
	return []object{o}, nil
}

// decodeObject decodes and validates one Service or EndpointSlice; def is
// its type when it names none.
func decodeObject(js []byte, def typeMeta, fail func(err error, objName string) error) (object, error) {
	var tm typeMeta
	if err := json.Unmarshal(js, &tm); err != nil {
		return object{}, fail(errors.New("an item must be an object with apiVersion and kind"), "")
	}
	if tm == (typeMeta{}) {
		tm = def
	}
	switch {
	case tm.APIVersion == "" || tm.Kind == "":
		missing := "apiVersion"
		if tm.Kind == "" {
			missing = "kind"
		}
		return object{}, fail(field.Required(field.NewPath(missing), "Service (v1) or EndpointSlice (discovery.k8s.io/v1)"), "")
	case tm.APIVersion == "v1" && tm.Kind == "Service":
		s := &v1.Service{}
		if err := strict(js, s); err != nil {
			return object{}, fail(err, "Service "+s.Namespace+"/"+s.Name)
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		name := "Service " + s.Namespace + "/" + s.Name
		if err := service.ValidateService(s); err != nil {
			return object{}, fail(err, name)
		}
		return object{key: name, svc: s}, nil
	case tm.APIVersion == "discovery.k8s.io/v1" && tm.Kind == "EndpointSlice":
		s := &discoveryv1.EndpointSlice{}
		if err := strict(js, s); err != nil {
			return object{}, fail(err, "EndpointSlice "+s.Namespace+"/"+s.Name)
		}
		if s.Namespace == "" {
			s.Namespace = "default"
		}
		name := "EndpointSlice " + s.Namespace + "/" + s.Name
		if err := service.ValidateEndpointSlice(s); err != nil {
			return object{}, fail(err, name)
		}
		return object{key: name, slice: s}, nil
	}
	return object{}, fail(fmt.Errorf("unsupported apiVersion %q kind %q: want Service (v1), EndpointSlice (discovery.k8s.io/v1) or a List of them", tm.APIVersion, tm.Kind), "")
}

// strict decodes JSON into v, refusing unknown and duplicate fields; errors
// name the field by its full path.
func strict(js []byte, v any) error {
	strictErrs, err := sjson.UnmarshalStrict(js, v)
	switch {
	case err != nil:
		return err
	case len(strictErrs) == 1:
		return strictErrs[0]
	case len(strictErrs) > 1:
		return strictError(strictErrs)
	}
	return nil
}

// strictError is several strict decoding errors, reported on one line.
type strictError []error

func (e strictError) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, ", ")
}

func (e strictError) Unwrap() []error { return e }

// fieldOf returns the field path an error names, when it names exactly one.
func fieldOf(err error) string {
	var fe sjson.FieldError
	if errors.As(err, &fe) {
		if j, ok := err.(interface{ Unwrap() []error }); !ok || len(j.Unwrap()) == 1 {
			return fe.FieldPath()
		}
	}
	var agg interface{ Errors() []error }
	if errors.As(err, &agg) && len(agg.Errors()) == 1 {
		var ferr *field.Error
		if errors.As(agg.Errors()[0], &ferr) {
			return ferr.Field
		}
	}
	var ferr *field.Error
	if errors.As(err, &ferr) {
		return ferr.Field
	}
	return ""
}
