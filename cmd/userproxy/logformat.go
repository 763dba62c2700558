package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// klogEncoder writes klog's text format, the one kube-proxy logs in by
// default (k8s.io/klog/v2 klog.go formatHeader, and textlogger's key=value
// pairs), so that the parsers admins already point at kube-proxy's logs
// read ours:
//
//	I1207 09:34:24.804821   12463 run.go:318] "Using ipvs Proxier" scheduler="lc"
//
// Severity I (debug and info), W or E (error and above), month and day,
// the time to the microsecond, the process id right-aligned in 7 columns,
// the caller's file and line, then the message quoted and the fields as
// key=value, strings quoted, other values as JSON. The fields are encoded
// by the embedded JSON encoder, which also keeps the With fields, without
// entry keys, and taken apart in order.
type klogEncoder struct {
	zapcore.Encoder // the fields, as JSON
	pid             int
}

var bufPool = buffer.NewPool()

func newKlogEncoder() zapcore.Encoder {
	return &klogEncoder{Encoder: zapcore.NewJSONEncoder(zapcore.EncoderConfig{
		EncodeDuration: zapcore.StringDurationEncoder, EncodeTime: zapcore.RFC3339NanoTimeEncoder,
	}), pid: os.Getpid()}
}

func (k *klogEncoder) Clone() zapcore.Encoder {
	return &klogEncoder{Encoder: k.Encoder.Clone(), pid: k.pid}
}

func (k *klogEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	js, err := k.Encoder.EncodeEntry(zapcore.Entry{}, fields)
	if err != nil {
		return nil, err
	}
	defer js.Free()
	out := bufPool.Get()
	sev := byte('I')
	switch {
	case ent.Level >= zapcore.ErrorLevel:
		sev = 'E'
	case ent.Level == zapcore.WarnLevel:
		sev = 'W'
	}
	t := ent.Time
	file, line := "???", 1
	if ent.Caller.Defined {
		file, line = filepath.Base(ent.Caller.File), ent.Caller.Line
	}
	fmt.Fprintf(out, "%c%02d%02d %02d:%02d:%02d.%06d %7d %s:%d] ", sev, int(t.Month()), t.Day(),
		t.Hour(), t.Minute(), t.Second(), t.Nanosecond()/1000, k.pid, file, line)
	quoted, _ := json.Marshal(ent.Message)
	out.Write(quoted)
	if ent.LoggerName != "" {
		name, _ := json.Marshal(ent.LoggerName)
		out.AppendString(" logger=")
		out.Write(name)
	}
	if err := appendKeyValues(out, bytes.TrimSpace(js.Bytes())); err != nil {
		out.Free()
		return nil, err
	}
	out.AppendByte('\n')
	return out, nil
}

// appendKeyValues writes the members of a JSON object as key=value, in
// their order.
func appendKeyValues(out *buffer.Buffer, obj []byte) error {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // {
		return fmt.Errorf("klog encoder: %w", err)
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return fmt.Errorf("klog encoder: %w", err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("klog encoder: %w", err)
		}
		out.AppendByte(' ')
		out.AppendString(fmt.Sprint(key))
		out.AppendByte('=')
		out.Write(v)
	}
	return nil
}
