package relay

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// tlsRefused reports whether err is a TLS failure that retrying cannot fix: the
// server's certificate is not trusted, does not name the host, or is not valid, or
// the server refuses TLS (or the client certificate). pgx reports these as
// connection errors, which unreachable would otherwise retry for ever, logging
// the same warning, while the cure is in postgres.dsn or on the server.
func tlsRefused(err error) bool {
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) || errors.As(err, &verify) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "server refused TLS connection") || strings.Contains(msg, "remote error: tls: ")
}

// explainTLS wraps a tlsRefused err with what is wrong in plain words and what to
// change; other errors are returned as they are.
func explainTLS(err error) error {
	if err == nil || !tlsRefused(err) {
		return err
	}
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	msg := err.Error()
	why := "the TLS handshake with Postgres failed: check the ssl settings of postgres.dsn (sslmode, sslrootcert, sslcert, sslkey)"
	switch {
	case errors.As(err, &unknown):
		why = "the Postgres server's certificate is not trusted: it is not signed by the CA in postgres.dsn's sslrootcert (or the system's roots when unset); set sslrootcert to the CA that signed it"
	case errors.As(err, &host):
		why = fmt.Sprintf("the Postgres server's certificate does not name the host in postgres.dsn (%s): connect by a name or address the certificate holds, or reissue the certificate with it", host.Host)
	case errors.As(err, &invalid):
		why = "the Postgres server's certificate is not valid (expired, not yet valid, or not for a server): renew it on the server"
	case strings.Contains(msg, "server refused TLS connection"):
		why = "the Postgres server does not accept TLS (ssl = off): turn ssl on in postgresql.conf, or lower sslmode in postgres.dsn"
	case strings.Contains(msg, "remote error: tls: "):
		why = "the Postgres server refused the TLS handshake, most likely the client certificate: set sslcert and sslkey in postgres.dsn to a certificate signed by the CA in the server's ssl_ca_file"
	}
	return fmt.Errorf("%s: %w", why, err)
}
