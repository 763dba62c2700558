package kubeapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// writePKI writes what the API server needs to serve and to sign tokens:
//
//	pki/ca.crt                    a CA made for this cluster only
//	pki/apiserver.crt, .key       its serving certificate for 127.0.0.1, ::1,
//	                              localhost and the first ClusterIP
//	pki/sa.key                    the service-account signing key (ES256)
//	tokens.csv                    one static token, AdminUser in system:masters
//
// and returns the CA certificate (PEM) and the admin token. Keys are ECDSA
// P-256: quick to make, and accepted for both serving and token signing.
func writePKI(dir string) (caPEM []byte, token string, err error) {
	pki := filepath.Join(dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return nil, "", err
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "userproxy-kubeapi-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, "", fmt.Errorf("CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, "", err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, ServiceCIDRs[0].Addr().Next().AsSlice()},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return nil, "", fmt.Errorf("serving certificate: %w", err)
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := []struct {
		name string
		data []byte
	}{
		{"ca.crt", caPEM},
		{"apiserver.crt", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER})},
	}
	for _, k := range []struct {
		name string
		key  *ecdsa.PrivateKey
	}{{"apiserver.key", srvKey}, {"sa.key", saKey}} {
		der, err := x509.MarshalECPrivateKey(k.key)
		if err != nil {
			return nil, "", err
		}
		files = append(files, struct {
			name string
			data []byte
		}{k.name, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})})
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(pki, f.name), f.data, 0o600); err != nil {
			return nil, "", err
		}
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, "", err
	}
	token = hex.EncodeToString(tok[:])
	// token,user,uid,"groups"
	line := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", token, AdminUser, AdminUser)
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(line), 0o600); err != nil {
		return nil, "", err
	}
	return caPEM, token, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux or macOS
	}
	return n
}
