package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

func main() {
	if err := embed(); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

func embed() error {
	logger, _ := zap.NewDevelopment()
	defer func() { _ = logger.Sync() }()

	// An endpoint: a server on loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello from the endpoint "+ln.Addr().String()+"\n")
			c.Close()
		}
	}()

	// The datapath: the proxy with its conntrack table (px.Run ticks its
	// clock, sweeps it and ends the flows whose entries leave it), the stack
	// over an in-memory link.
	px, err := proxy.New(proxy.Config{Conntrack: conntrack.Config{Max: 4096}, Logger: logger.Named("proxy")})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); px.Run(runCtx) }()
	defer func() { stop(); <-ran }()
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 64).Link, Conntrack: px.Conntrack(), Reassembler: px.Reassembler(), Admit: px.Admit, Logger: logger.Named("netstack")})
	if err != nil {
		return err
	}
	defer st.Close()
	st.SetFlowHandler(px)
	tracker, err := service.NewTracker(service.Config{OnSync: px.SetTable})
	if err != nil {
		return err
	}
	defer tracker.Close()

	// The objects, as a source would deliver them (source/file or
	// source/kube can feed the same tracker).
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	name, proto := "http", v1.ProtocolTCP
	tracker.OnServiceAdd(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: name, Protocol: proto, Port: 80, TargetPort: intstr.FromInt32(port)}}},
	})
	tracker.OnEndpointSliceAdd(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	})
	tracker.OnSynced()

	// Dial the ClusterIP in-process.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "tcp", "10.96.0.10:80")
	if err != nil {
		return err
	}
	defer c.Close()
	reply, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	fmt.Printf("10.96.0.10:80 answered: %s", reply)
	return nil
}
