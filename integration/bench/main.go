package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "serve":
		err = serveMain(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "load":
		err = loadMain(os.Args[2:])
	case len(os.Args) > 2 && os.Args[1] == "tunexec":
		err = tunExec(os.Args[2], os.Args[3:])
	case len(os.Args) == 4 && os.Args[1] == "fetch":
		err = fetch(os.Args[2], os.Args[3])
	default:
		err = harnessMain(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// fetch saves what url serves in file (profiles from userproxy's admin
// server, which listens inside the client namespace).
func fetch(url, file string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
