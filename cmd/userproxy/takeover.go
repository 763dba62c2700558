package main

// The servers' ports while taking over (handover_linux.go): the running
// proxy holds them until it has handed over and exits.

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// takeOverListenWait bounds the wait for a port the old process holds
// until it exits.
const takeOverListenWait = 10 * time.Second

// listenTakingOver listens on addr ("" for none), waiting for the old
// process to release it.
func listenTakingOver(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return retryTaken(func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// retryTaken calls listen until it does not fail with a taken address, for
// takeOverListenWait at most.
func retryTaken(listen func() (net.Listener, error)) (net.Listener, error) {
	deadline := time.Now().Add(takeOverListenWait)
	for {
		ln, err := listen()
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return ln, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
