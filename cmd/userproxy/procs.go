package main

import (
	"context"
	"os"
	"runtime"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/internal/procs"
)

// runProcs applies --procs until ctx is done: n Ps fixed, or, for 0 (the
// default) without the GOMAXPROCS variable, between one P and the
// runtime's default by load (internal/procs).
func runProcs(ctx context.Context, n int, logger *zap.Logger) {
	logger = logger.Named("procs")
	switch {
	case n > 0:
		runtime.GOMAXPROCS(n)
		logger.Info("GOMAXPROCS fixed by --procs", zap.Int("procs", n))
		return
	case os.Getenv("GOMAXPROCS") != "":
		logger.Info("GOMAXPROCS fixed by the GOMAXPROCS variable", zap.Int("procs", runtime.GOMAXPROCS(0)))
		return
	}
	most := runtime.GOMAXPROCS(0)
	logger.Info("GOMAXPROCS follows the load: 1 while one CPU keeps up, up to all of them while goroutines wait (--procs N fixes it)", zap.Int("most", most))
	procs.Run(ctx, procs.Config{Max: most, Changed: func(n int) {
		if ce := logger.Check(zap.DebugLevel, "GOMAXPROCS changed"); ce != nil {
			ce.Write(zap.Int("procs", n))
		}
	}})
}
