package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestKlogFormat: --log-format text writes klog's lines (k8s.io/klog/v2
// formatHeader: severity, MMDD, time to the microsecond, pid in 7 columns,
// file:line; then the quoted message and key=value pairs in order), and
// kube-proxy's default logging.format, text, is that format.
func TestKlogFormat(t *testing.T) {
	var buf bytes.Buffer
	l := logFlags{level: "debug", format: "text"}
	logger, err := l.newLogger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.Named("proxy").With(zap.String("node", "a")).Info("Using ipvs Proxier", zap.String("scheduler", "lc"),
		zap.Int("n", 3), zap.Duration("d", 1500*time.Millisecond), zap.Error(errors.New("a \"quoted\" error")),
		zap.Strings("cidrs", []string{"10.96.0.0/12"}))
	logger.Warn("w")
	logger.Error("e")
	logger.Debug("d")
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 lines, got %q", buf.String())
	}
	head := fmt.Sprintf(`\d{4} \d{2}:\d{2}:\d{2}\.\d{6} %7d logformat_test\.go:\d+\] `, os.Getpid())
	for i, want := range []string{
		`^I` + head + `"Using ipvs Proxier" logger="proxy" node="a" scheduler="lc" n=3 d="1.5s" error="a \\"quoted\\" error" cidrs=\["10.96.0.0/12"\]$`,
		`^W` + head + `"w"$`,
		`^E` + head + `"e"$`,
		`^I` + head + `"d"$`,
	} {
		if !regexp.MustCompile(want).MatchString(lines[i]) {
			t.Errorf("line %d:\n got %s\nwant %s", i, lines[i], want)
		}
	}
}
