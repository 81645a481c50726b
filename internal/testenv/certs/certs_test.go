package certs

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestEnsure(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	if wrote, err := Ensure(dir, now); err != nil || !wrote {
		t.Fatalf("Ensure(empty dir) = %t, %v; want true, nil", wrote, err)
	}
	before, err := os.ReadFile(filepath.Join(dir, CA))
	if err != nil {
		t.Fatal(err)
	}
	if wrote, err := Ensure(dir, now); err != nil || wrote {
		t.Fatalf("Ensure(valid set) = %t, %v; want false, nil: nothing to change", wrote, err)
	}
	for _, key := range []string{CAKey, ServerKey, ServerBundle, PGClientKey, KafkaKey, OtherKey} {
		if fi, err := os.Stat(filepath.Join(dir, key)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", key, fi.Mode().Perm(), err)
		}
	}

	// What the servers and clients rely on.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(before)
	server, err := tls.LoadX509KeyPair(filepath.Join(dir, ServerCert), filepath.Join(dir, ServerKey))
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(server.Certificate[0])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"}); err != nil {
		t.Errorf("server certificate for 127.0.0.1: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost"}); err == nil {
		t.Errorf("server certificate verifies for localhost; want it to name 127.0.0.1 only (the wrong-host tests use localhost)")
	}
	for file, cn := range map[string]string{PGClientCert: PGClientUser, KafkaClient: KafkaClientUser} {
		b, _ := os.ReadFile(filepath.Join(dir, file))
		c, err := parseCert(b)
		if err != nil || c.Subject.String() != "CN="+cn {
			t.Errorf("%s: subject %v, %v; want CN=%s", file, c.Subject, err, cn)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, OtherClient))
	other, _ := parseCert(b)
	if _, err := other.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Errorf("%s verifies against the dev CA; want it signed by %s only", OtherClient, OtherCA)
	}

	// A damaged or expiring set is replaced whole.
	if err := os.Remove(filepath.Join(dir, KafkaKey)); err != nil {
		t.Fatal(err)
	}
	if wrote, err := Ensure(dir, now); err != nil || !wrote {
		t.Fatalf("Ensure(key missing) = %t, %v; want true, nil", wrote, err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, CA))
	if string(after) == string(before) {
		t.Errorf("Ensure kept the CA of a damaged set; want a new set")
	}
	if wrote, err := Ensure(dir, now.Add(Validity-RenewBefore/2)); err != nil || !wrote {
		t.Errorf("Ensure(near expiry) = %t, %v; want true, nil", wrote, err)
	}
}
