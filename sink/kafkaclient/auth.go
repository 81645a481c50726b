package kafkaclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/field"
)

// AuthError is a broker's refusal of the relay's own settings: its SASL
// credentials or mechanism, or a TLS handshake that fails on certificates (the
// broker's is not trusted or does not name the broker, or the broker wants a
// client certificate it does not get or does not trust). Unlike an outage,
// waiting does not fix it: Field names the field of Config to change.
type AuthError struct {
	Field  string // the field of Config to fix, like "SASL.Password"
	Reason string // what is wrong, in plain words, with the fix; {Field} names other fields
	Err    error  // what Kafka (kerr) or crypto/tls answered
}

func (e *AuthError) Error() string {
	return fmt.Sprintf("kafka refused the connection: %s (%v)", e.FieldError(), e.Err)
}

// FieldError is the refusal as a *field.Error of the field to change.
func (e *AuthError) FieldError() *field.Error {
	return &field.Error{Field: e.Field, Reason: e.Reason}
}

func (e *AuthError) Unwrap() error { return e.Err }

// Refused turns err, an error of a client made from c, into an *AuthError
// when it is a refusal of c's settings, and returns nil otherwise.
func (c *Config) Refused(err error) error {
	sasl := c.SASL
	mech := strings.ToUpper(sasl.Mechanism)
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var rec tls.RecordHeaderError
	msg := err.Error()
	if ae := c.tokenAuthError(err, errors.Is(err, kerr.SaslAuthenticationFailed)); ae != nil {
		return ae
	}
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed):
		return &AuthError{Field: "SASL.Password", Err: err,
			Reason: fmt.Sprintf("the broker refused the SASL %s login of user %q: set {SASL.Username} and {SASL.Password} to credentials the cluster knows", mech, sasl.Username)}
	case errors.Is(err, kerr.UnsupportedSaslMechanism):
		return &AuthError{Field: "SASL.Mechanism", Err: err,
			Reason: fmt.Sprintf("the broker does not offer SASL %s on this listener: set {SASL.Mechanism} to one it has enabled (sasl.enabled.mechanisms), or use the listener that offers it", mech)}
	case errors.As(err, &unknown):
		return &AuthError{Field: "TLS.CAFile", Err: err,
			Reason: "the broker's certificate is not signed by a trusted CA: set {TLS.CAFile} to the CA (PEM) that signed it"}
	case errors.As(err, &host):
		return &AuthError{Field: "TLS.ServerName", Err: err,
			Reason: "the broker's certificate does not name the host the relay connects to: use a broker address the certificate names ({Brokers}, and advertised.listeners on the broker), or set {TLS.ServerName} to a name it holds"}
	case errors.As(err, &invalid):
		return &AuthError{Field: "TLS.CAFile", Err: err,
			Reason: "the broker's certificate is not valid (expired, not yet valid, or not for a server): renew it on the broker"}
	case errors.As(err, &verify):
		return &AuthError{Field: "TLS.CAFile", Err: err,
			Reason: "the broker's certificate failed verification: check {TLS.CAFile} against the broker's certificate"}
	case errors.As(err, &rec) || strings.Contains(msg, "first record does not look like a TLS handshake"):
		return &AuthError{Field: "TLS.Enabled", Err: err,
			Reason: "the broker does not speak TLS on this listener: turn {TLS.Enabled} off, or use its SSL or SASL_SSL listener"}
	case !c.TLS.Enabled && strings.Contains(msg, "speaking to a tls endpoint"):
		// kgo's words (kgo.ErrLargeRespSize) when a TLS listener answers a
		// plain client with a TLS alert.
		return &AuthError{Field: "TLS.Enabled", Err: err,
			Reason: "the broker expects TLS on this listener: turn {TLS.Enabled} on (with {TLS.CAFile} for a private CA), or use a plain listener"}
	case strings.Contains(msg, "remote error: tls: certificate required"),
		strings.Contains(msg, "remote error: tls: bad certificate"),
		strings.Contains(msg, "remote error: tls: unknown certificate authority"),
		strings.Contains(msg, "remote error: tls: handshake failure") && c.TLS.CertFile == "":
		why := "the broker requires a client certificate signed by a CA it trusts (ssl.client.auth=required): set {TLS.CertFile} and {TLS.KeyFile} to one"
		if c.TLS.CertFile != "" {
			why = "the broker does not accept the client certificate in {TLS.CertFile}: use one signed by a CA in the broker's ssl.truststore"
		}
		return &AuthError{Field: "TLS.CertFile", Err: err, Reason: why}
	}
	return nil
}
