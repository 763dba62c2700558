package kube

import (
	"fmt"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// klogToZap returns the logger client-go's informers find in their context:
// their messages (reflector retries, watch closures) go to our logger at
// debug level, since Source reports the state of the connection itself.
// Errors are kept at debug too: each failed call is also counted in Stats.
func klogToZap(l *zap.Logger) klog.Logger {
	return logr.New(zapSink{l: l.Named("client-go").WithOptions(zap.AddCallerSkip(1))})
}

type zapSink struct {
	l *zap.Logger
}

func (z zapSink) Init(logr.RuntimeInfo) {}

func (z zapSink) Enabled(int) bool { return z.l.Core().Enabled(zapcore.DebugLevel) }

func (z zapSink) Info(level int, msg string, kv ...any) {
	if ce := z.l.Check(zapcore.DebugLevel, msg); ce != nil {
		ce.Write(append(fields(kv), zap.Int("v", level))...)
	}
}

func (z zapSink) Error(err error, msg string, kv ...any) {
	if ce := z.l.Check(zapcore.DebugLevel, msg); ce != nil {
		ce.Write(append(fields(kv), zap.Error(err))...)
	}
}

func (z zapSink) WithValues(kv ...any) logr.LogSink { return zapSink{l: z.l.With(fields(kv)...)} }

func (z zapSink) WithName(name string) logr.LogSink { return zapSink{l: z.l.Named(name)} }

// fields turns logr's alternating keys and values into zap fields.
func fields(kv []any) []zap.Field {
	out := make([]zap.Field, 0, len(kv)/2+1)
	for i := 0; i < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			key = fmt.Sprint(kv[i])
		}
		if i+1 == len(kv) {
			out = append(out, zap.Any(key, "(missing value)"))
			break
		}
		out = append(out, zap.Any(key, kv[i+1]))
	}
	return out
}
