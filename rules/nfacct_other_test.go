//go:build !linux

package rules_test

import "testing"

// nfacctSetup: the round trip runs on Linux only.
func nfacctSetup(t *testing.T) string { t.Helper(); return "" }
