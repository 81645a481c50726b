// Package certs generates the TLS material of the dev servers (scripts/dev.sh) and
// the tests that use them: a dev CA, a server certificate for 127.0.0.1, client
// certificates for Postgres' cert authentication and Kafka's mTLS listener, and an
// unrelated CA for "wrong CA" tests. Go's crypto/x509 only: no openssl, no keytool.
//
// Invariants:
//   - Ensure leaves a directory whose files all belong together: either every file
//     is valid (parses, is signed by the dev CA, names what it must, and does not
//     expire within RenewBefore), and it changes nothing, or it writes a whole new
//     set. A half-written set is never left behind (each file is written to a
//     temporary name and renamed).
//   - The server certificate names the IP address 127.0.0.1 and nothing else, on
//     purpose: the dev servers listen there only, and "localhost" is then a host
//     name that reaches the server but is not in its certificate, which the
//     wrong-host-name tests need.
//   - Private keys are ECDSA P-256 in PKCS#8 PEM ("PRIVATE KEY"), the one form that
//     Postgres (OpenSSL), Kafka's PEM key store and Go all read, written with mode
//     0600.
package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// File names inside the directory.
const (
	CA           = "ca.pem"           // the dev CA: servers' and clients' trust root
	CAKey        = "ca.key"           // kept so that a person can issue more certificates
	ServerCert   = "server.pem"       // 127.0.0.1, signed by the dev CA
	ServerKey    = "server.key"       // its key
	ServerBundle = "server-key.pem"   // key + certificate in one file: Kafka's PEM key store
	PGClientCert = "pg-client.pem"    // CN=PGClientUser: Postgres cert authentication
	PGClientKey  = "pg-client.key"    // its key
	KafkaClient  = "kafka-client.pem" // CN=KafkaClientUser: Kafka's mTLS listener
	KafkaKey     = "kafka-client.key" // its key
	OtherCA      = "other-ca.pem"     // an unrelated CA that signed nothing here
	OtherClient  = "other-client.pem" // CN=KafkaClientUser, but signed by OtherCA
	OtherKey     = "other-client.key" // its key
)

// Names written into the client certificates.
const (
	PGClientUser    = "relay_cert" // the Postgres role that logs in with its certificate
	KafkaClientUser = "relay"      // the Kafka principal (User:relay) of the mTLS client
)

// ServerIP is the only name of the server certificate.
var ServerIP = net.IPv4(127, 0, 0, 1)

// Validity of new certificates, and how long before expiry Ensure renews them.
const (
	Validity    = 10 * 365 * 24 * time.Hour
	RenewBefore = 30 * 24 * time.Hour
)

// Ensure makes dir hold a valid set of files (see the package doc). It reports
// whether it wrote a new set.
func Ensure(dir string, now time.Time) (bool, error) {
	if err := check(dir, now); err == nil {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("certs: %w", err)
	}
	files, err := generate(now)
	if err != nil {
		return false, fmt.Errorf("certs: %w", err)
	}
	// The CA last: check reads it first, so an interrupted write leaves a set
	// that check rejects and the next Ensure replaces.
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	names = slices.DeleteFunc(names, func(n string) bool { return n == CA })
	names = append(names, CA)
	for _, name := range names {
		if err := writeFile(filepath.Join(dir, name), files[name]); err != nil {
			return false, fmt.Errorf("certs: %w", err)
		}
	}
	return true, nil
}

// check returns nil when dir holds a complete, valid set.
func check(dir string, now time.Time) error {
	read := func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(dir, name)) }
	caPEM, err := read(CA)
	if err != nil {
		return err
	}
	ca, err := parseCert(caPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", CA, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	leaf := func(certName, keyName string, usage x509.ExtKeyUsage, pool *x509.CertPool) (*x509.Certificate, error) {
		certPEM, err := read(certName)
		if err != nil {
			return nil, err
		}
		cert, err := parseCert(certPEM)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", certName, err)
		}
		if cert.NotAfter.Before(now.Add(RenewBefore)) {
			return nil, fmt.Errorf("%s expires %s", certName, cert.NotAfter)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			return nil, fmt.Errorf("%s: %w", certName, err)
		}
		keyPEM, err := read(keyName)
		if err != nil {
			return nil, err
		}
		key, err := parseKey(keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keyName, err)
		}
		if !key.PublicKey.Equal(cert.PublicKey) {
			return nil, fmt.Errorf("%s does not belong to %s", keyName, certName)
		}
		return cert, nil
	}
	if ca.NotAfter.Before(now.Add(RenewBefore)) {
		return fmt.Errorf("%s expires %s", CA, ca.NotAfter)
	}
	if _, err := read(CAKey); err != nil {
		return err
	}
	server, err := leaf(ServerCert, ServerKey, x509.ExtKeyUsageServerAuth, roots)
	if err != nil {
		return err
	}
	if len(server.IPAddresses) != 1 || !server.IPAddresses[0].Equal(ServerIP) || len(server.DNSNames) != 0 {
		return fmt.Errorf("%s names %v %v, want %s only", ServerCert, server.IPAddresses, server.DNSNames, ServerIP)
	}
	bundle, err := read(ServerBundle)
	if err != nil {
		return err
	}
	certPEM, _ := read(ServerCert)
	keyPEM, _ := read(ServerKey)
	if !bytes.Equal(bundle, append(slices.Clip(keyPEM), certPEM...)) {
		return fmt.Errorf("%s is not %s followed by %s", ServerBundle, ServerKey, ServerCert)
	}
	if c, err := leaf(PGClientCert, PGClientKey, x509.ExtKeyUsageClientAuth, roots); err != nil {
		return err
	} else if c.Subject.CommonName != PGClientUser {
		return fmt.Errorf("%s is for %q, want %q", PGClientCert, c.Subject.CommonName, PGClientUser)
	}
	if c, err := leaf(KafkaClient, KafkaKey, x509.ExtKeyUsageClientAuth, roots); err != nil {
		return err
	} else if c.Subject.CommonName != KafkaClientUser {
		return fmt.Errorf("%s is for %q, want %q", KafkaClient, c.Subject.CommonName, KafkaClientUser)
	}
	otherPEM, err := read(OtherCA)
	if err != nil {
		return err
	}
	other, err := parseCert(otherPEM)
	if err != nil {
		return fmt.Errorf("%s: %w", OtherCA, err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AddCert(other)
	if _, err := leaf(OtherClient, OtherKey, x509.ExtKeyUsageClientAuth, otherRoots); err != nil {
		return err
	}
	return nil
}

// generate makes a new set of files, by name.
func generate(now time.Time) (map[string][]byte, error) {
	files := make(map[string][]byte)
	ca, caKey, err := newCA("outbox-relay dev CA", now)
	if err != nil {
		return nil, err
	}
	files[CA] = certPEM(ca)
	if files[CAKey], err = keyPEM(caKey); err != nil {
		return nil, err
	}
	issue := func(certName, keyName string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) error {
		cert, key, err := newLeaf(tmpl, parent, parentKey, now)
		if err != nil {
			return err
		}
		files[certName] = certPEM(cert)
		files[keyName], err = keyPEM(key)
		return err
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "outbox-relay dev server", Organization: []string{"outbox-relay dev"}},
		IPAddresses: []net.IP{ServerIP},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if err := issue(ServerCert, ServerKey, server, ca, caKey); err != nil {
		return nil, err
	}
	files[ServerBundle] = append(slices.Clip(files[ServerKey]), files[ServerCert]...)
	client := func(cn string) *x509.Certificate {
		// The subject is the CN alone: Kafka's default principal is the whole
		// DN, and Postgres' cert authentication compares the CN.
		return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	}
	if err := issue(PGClientCert, PGClientKey, client(PGClientUser), ca, caKey); err != nil {
		return nil, err
	}
	if err := issue(KafkaClient, KafkaKey, client(KafkaClientUser), ca, caKey); err != nil {
		return nil, err
	}
	other, otherKey, err := newCA("unrelated CA (outbox-relay tests)", now)
	if err != nil {
		return nil, err
	}
	files[OtherCA] = certPEM(other)
	if err := issue(OtherClient, OtherKey, client(KafkaClientUser), other, otherKey); err != nil {
		return nil, err
	}
	return files, nil
}

func newCA(cn string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"outbox-relay dev"}},
		NotBefore:             now.Add(-time.Hour), // clock skew between the servers and the tests
		NotAfter:              now.Add(Validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func newLeaf(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(Validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseKey(b []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PKCS#8 PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("key is %T, want ECDSA", k)
	}
	return ek, nil
}

// writeFile writes data to a temporary file beside path and renames it there, mode
// 0600 for keys and 0644 for certificates.
func writeFile(path string, data []byte) error {
	mode := os.FileMode(0o644)
	if bytes.Contains(data, []byte("PRIVATE KEY")) {
		mode = 0o600
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
