//go:build !linux

package handover

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Handover moves descriptors with Linux's SCM_RIGHTS over SOCK_SEQPACKET
// and checks the taker with SO_PEERCRED; elsewhere a new process starts
// clean.

// ErrNoServer is a Dial that found no running process to take over from.
var ErrNoServer = errors.New("handover: no running process to take over from")

// ErrRefused is the running process's refusal.
var ErrRefused = errors.New("handover: refused")

var errUnsupported = fmt.Errorf("handover: %w on this system", errors.ErrUnsupported)

// Server is not available here.
type Server struct{}

// Listen reports that handover is not supported here.
func Listen(path string) (*Server, error) { return nil, errUnsupported }

func (s *Server) Path() string          { return "" }
func (s *Server) Offers() <-chan *Offer { return nil }
func (s *Server) Close() error          { return nil }

// Offer is not available here.
type Offer struct {
	Format   uint16
	TakerPID int
}

func (o *Offer) Refuse(reason string)                                         {}
func (o *Offer) Send(snapshot []byte, fds []int, timeout time.Duration) error { return errUnsupported }
func (o *Offer) Wait(timeout time.Duration) error                             { return errUnsupported }

// Taker is not available here.
type Taker struct {
	Format    uint16
	ServerPID int
}

// Dial finds no running process to take over from: a clean start.
func Dial(path string, timeout time.Duration) (*Taker, error) { return nil, ErrNoServer }

// ServerPID finds no running process to take over from.
func ServerPID(path string) (int, error) { return 0, ErrNoServer }

func (t *Taker) Receive(timeout time.Duration) ([]byte, []*os.File, error) {
	return nil, nil, errUnsupported
}
func (t *Taker) Confirm(timeout time.Duration) error { return errUnsupported }
func (t *Taker) Fail(reason string)                  {}
func (t *Taker) Close()                              {}
