package main

import (
	"fmt"
	"os"
)

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "serve":
		err = serveMain(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "load":
		err = loadMain(os.Args[2:])
	default:
		err = harnessMain(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
