package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
// by a JSON encoder without entry keys and taken apart in order.
type klogEncoder struct {
	fields zapcore.Encoder // With fields, as JSON
	pid    int
}

var bufPool = buffer.NewPool()

func newKlogEncoder() zapcore.Encoder {
	return &klogEncoder{fields: zapcore.NewJSONEncoder(zapcore.EncoderConfig{
		EncodeDuration: zapcore.StringDurationEncoder, EncodeTime: zapcore.RFC3339NanoTimeEncoder,
	}), pid: os.Getpid()}
}

// The field methods are the JSON encoder's: With fields accumulate there.
func (k *klogEncoder) AddArray(key string, v zapcore.ArrayMarshaler) error {
	return k.fields.AddArray(key, v)
}
func (k *klogEncoder) AddObject(key string, v zapcore.ObjectMarshaler) error {
	return k.fields.AddObject(key, v)
}
func (k *klogEncoder) AddBinary(key string, v []byte)          { k.fields.AddBinary(key, v) }
func (k *klogEncoder) AddByteString(key string, v []byte)      { k.fields.AddByteString(key, v) }
func (k *klogEncoder) AddBool(key string, v bool)              { k.fields.AddBool(key, v) }
func (k *klogEncoder) AddComplex128(key string, v complex128)  { k.fields.AddComplex128(key, v) }
func (k *klogEncoder) AddComplex64(key string, v complex64)    { k.fields.AddComplex64(key, v) }
func (k *klogEncoder) AddDuration(key string, v time.Duration) { k.fields.AddDuration(key, v) }
func (k *klogEncoder) AddFloat64(key string, v float64)        { k.fields.AddFloat64(key, v) }
func (k *klogEncoder) AddFloat32(key string, v float32)        { k.fields.AddFloat32(key, v) }
func (k *klogEncoder) AddInt(key string, v int)                { k.fields.AddInt(key, v) }
func (k *klogEncoder) AddInt64(key string, v int64)            { k.fields.AddInt64(key, v) }
func (k *klogEncoder) AddInt32(key string, v int32)            { k.fields.AddInt32(key, v) }
func (k *klogEncoder) AddInt16(key string, v int16)            { k.fields.AddInt16(key, v) }
func (k *klogEncoder) AddInt8(key string, v int8)              { k.fields.AddInt8(key, v) }
func (k *klogEncoder) AddString(key, v string)                 { k.fields.AddString(key, v) }
func (k *klogEncoder) AddTime(key string, v time.Time)         { k.fields.AddTime(key, v) }
func (k *klogEncoder) AddUint(key string, v uint)              { k.fields.AddUint(key, v) }
func (k *klogEncoder) AddUint64(key string, v uint64)          { k.fields.AddUint64(key, v) }
func (k *klogEncoder) AddUint32(key string, v uint32)          { k.fields.AddUint32(key, v) }
func (k *klogEncoder) AddUint16(key string, v uint16)          { k.fields.AddUint16(key, v) }
func (k *klogEncoder) AddUint8(key string, v uint8)            { k.fields.AddUint8(key, v) }
func (k *klogEncoder) AddUintptr(key string, v uintptr)        { k.fields.AddUintptr(key, v) }
func (k *klogEncoder) AddReflected(key string, v any) error    { return k.fields.AddReflected(key, v) }
func (k *klogEncoder) OpenNamespace(key string)                { k.fields.OpenNamespace(key) }

func (k *klogEncoder) Clone() zapcore.Encoder {
	return &klogEncoder{fields: k.fields.Clone(), pid: k.pid}
}

func (k *klogEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	js, err := k.fields.EncodeEntry(zapcore.Entry{}, fields)
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
