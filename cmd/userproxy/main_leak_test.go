package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that the commands' tests leave no goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
