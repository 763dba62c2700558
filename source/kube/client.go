package kube

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ClientOptions are kube-proxy's clientConnection settings and --master;
// the zero value of each field means kube-proxy's default.
type ClientOptions struct {
	Kubeconfig  string  // "" with no Master: the in-cluster configuration
	Master      string  // the API server's URL, over the kubeconfig's
	QPS         float32 // 5
	Burst       int     // 10
	ContentType string  // protobuf
}

// RESTConfig returns the client configuration for a kubeconfig file, or,
// with an empty path, the in-cluster configuration (service account token
// and KUBERNETES_SERVICE_HOST), as kube-proxy chooses. It asks for
// protobuf, with kube-proxy's client rate limits (QPS 5, burst 10).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	return RESTConfigWith(ClientOptions{Kubeconfig: kubeconfig})
}

// RESTConfigWith is RESTConfig with kube-proxy's client options.
func RESTConfigWith(o ClientOptions) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.Kubeconfig == "" && o.Master == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no objects to serve: neither --config nor --kubeconfig is given, and this is not a pod (in-cluster configuration: %w); "+
				"serve a file of Services and EndpointSlices with --config FILE, or a cluster with --kubeconfig FILE", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags(o.Master, o.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", o.Kubeconfig, err)
		}
	}
	cfg.UserAgent = "userproxy"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	if o.ContentType != "" {
		cfg.ContentType = o.ContentType
	}
	cfg.QPS, cfg.Burst = 5, 10
	if o.QPS != 0 {
		cfg.QPS = o.QPS
	}
	if o.Burst != 0 {
		cfg.Burst = o.Burst
	}
	return cfg, nil
}

// NewClient returns a clientset for RESTConfig(kubeconfig). It does not
// contact the server.
func NewClient(kubeconfig string) (kubernetes.Interface, error) {
	return NewClientWith(ClientOptions{Kubeconfig: kubeconfig})
}

// NewClientWith is NewClient with kube-proxy's client options.
func NewClientWith(o ClientOptions) (kubernetes.Interface, error) {
	cfg, err := RESTConfigWith(o)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}
