//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "quickstart: needs Linux network namespaces")
	os.Exit(1)
}
