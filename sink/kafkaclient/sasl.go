package kafkaclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	kgosasl "github.com/twmb/franz-go/pkg/sasl"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient/awsmsk"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient/oauthbearer"
)

// This file holds the SASL mechanisms without a password: OAUTHBEARER (a
// token from a file or a command, package oauthbearer) and AWS_MSK_IAM
// (package awsmsk). Each is franz-go's sasl.Mechanism.

// tokenMechanism reports whether mech authenticates without a user name and
// password.
func tokenMechanism(mech string) bool { return mech == "oauthbearer" || mech == "aws_msk_iam" }

// validateTokenSASL checks OAUTHBEARER's and AWS_MSK_IAM's settings as far as
// can be done without a broker: one token source, readable or found on PATH;
// AWS credentials and a region. It makes the token source every client of
// the sink then shares (a command runs once for all of them).
func (c *Config) validateTokenSASL(v *field.Checker) {
	s := &c.SASL
	name := strings.ToUpper(s.Mechanism)
	if s.Username != "" || s.Password != "" {
		v.Errorf("SASL.Username", "set, but SASL %s takes no user name or password (the principal is the token's or the AWS identity's): unset {SASL.Username} and {SASL.Password}", name)
	}
	if s.Mechanism == "aws_msk_iam" {
		if s.OAuthTokenFile != "" || s.OAuthTokenCommand != "" {
			v.Errorf("SASL.OAuthTokenFile", "set, but SASL AWS_MSK_IAM signs with AWS credentials, not a token: unset {SASL.OAuthTokenFile} and {SASL.OAuthTokenCommand}, or set {SASL.Mechanism} to oauthbearer")
		}
		if _, err := awsmsk.Credentials(); err != nil {
			v.Errorf("SASL.Mechanism", "SASL AWS_MSK_IAM cannot sign: %v", err)
		}
		if err := awsmsk.CheckRegion(c.Brokers); err != nil {
			v.Errorf("Brokers", "SASL AWS_MSK_IAM: %v", err)
		}
		return
	}
	switch {
	case s.OAuthTokenFile != "" && s.OAuthTokenCommand != "":
		v.Errorf("SASL.OAuthTokenCommand", "set, and so is {SASL.OAuthTokenFile}: keep one: the file for a token something else writes and renews, the command for a token the relay asks for")
		return
	case s.OAuthTokenFile == "" && s.OAuthTokenCommand == "":
		v.Add(field.Required("SASL.OAuthTokenFile", "SASL OAUTHBEARER needs a token: set {SASL.OAuthTokenFile} to the file that holds it, or {SASL.OAuthTokenCommand} to a command that prints it"))
		return
	case s.OAuthTokenFile != "":
		if _, err := os.ReadFile(s.OAuthTokenFile); err != nil {
			v.Errorf("SASL.OAuthTokenFile", "cannot read it: %v; it is read again for every connection, so it must exist and be readable by the relay's user when the relay starts", err)
			return
		}
	default:
		if err := commandFound(s.OAuthTokenCommand); err != nil {
			v.Errorf("SASL.OAuthTokenCommand", "%v", err)
			return
		}
	}
	cfg := oauthbearer.Config{File: s.OAuthTokenFile, Command: s.OAuthTokenCommand}
	if s.tokens == nil || s.tokensOf.File != cfg.File || s.tokensOf.Command != cfg.Command {
		src, err := oauthbearer.New(cfg)
		if err != nil {
			v.Errorf("SASL.OAuthTokenFile", "%v", err)
			return
		}
		s.tokens, s.tokensOf = src, cfg
	}
}

// commandFound checks that the program a token command starts exists, when
// the command begins with a program's name (not shell syntax, which only the
// shell can judge).
func commandFound(command string) error {
	words := strings.Fields(command)
	if len(words) == 0 || strings.ContainsAny(words[0], "=$`'\"(){};|&<>\\*?~") {
		return nil
	}
	if _, err := exec.LookPath(words[0]); err != nil {
		return fmt.Errorf("the token command's program %q is not found (%v): install it, or give its full path", words[0], err)
	}
	return nil
}

// tokenSASL is the franz-go mechanism of OAUTHBEARER or AWS_MSK_IAM;
// Validate has checked the settings.
func (c *Config) tokenSASL() kgosasl.Mechanism {
	if c.SASL.Mechanism == "aws_msk_iam" {
		return sourceMechanism{awsmsk.Mechanism()}
	}
	return sourceMechanism{c.SASL.tokens.Mechanism()}
}

// sourceMechanism marks an error of the token or credentials source (a file
// that went missing, a command that failed, an expired token) as a
// *sourceError, for authError: the relay's setting is at fault, not the
// broker.
type sourceMechanism struct{ kgosasl.Mechanism }

func (m sourceMechanism) Authenticate(ctx context.Context, host string) (kgosasl.Session, []byte, error) {
	sess, first, err := m.Mechanism.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, &sourceError{err}
	}
	return sess, first, nil
}

type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// tokenAuthError is authError's word on an OAUTHBEARER or AWS_MSK_IAM
// failure, nil for another.
func (c *Config) tokenAuthError(err error, refused bool) error {
	s := c.SASL
	if !tokenMechanism(s.Mechanism) {
		return nil
	}
	var src *sourceError
	source := errors.As(err, &src)
	if s.Mechanism == "aws_msk_iam" {
		switch {
		case source:
			return &AuthError{Field: "SASL.Mechanism", Err: err,
				Reason: "SASL AWS_MSK_IAM found no AWS credentials to sign with: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) for the relay, or a profile in the AWS credentials file"}
		case refused:
			return &AuthError{Field: "SASL.Mechanism", Err: err,
				Reason: "the broker refused the SASL AWS_MSK_IAM login: the IAM identity of the relay's AWS credentials needs kafka-cluster:Connect on the cluster (and WriteData, DescribeTopic on its topics); temporary credentials must not have expired (AWS_SESSION_TOKEN)"}
		}
		return nil
	}
	fieldName, renew := "SASL.OAuthTokenFile", "whatever writes {SASL.OAuthTokenFile} (an identity agent, a projected service-account token) has stopped renewing it: make it write a fresh token before the old one expires; the relay reads the file again for every connection"
	if s.OAuthTokenCommand != "" {
		fieldName, renew = "SASL.OAuthTokenCommand", "{SASL.OAuthTokenCommand} printed a token that had already expired: make it print a fresh one"
	}
	switch {
	case errors.Is(err, oauthbearer.ErrExpired):
		return &AuthError{Field: fieldName, Err: err, Reason: "the SASL OAUTHBEARER token has expired: " + renew}
	case errors.Is(err, oauthbearer.ErrRefused), refused:
		return &AuthError{Field: fieldName, Err: err,
			Reason: "the broker refused the SASL OAUTHBEARER token: compare its issuer (iss), audience (aud), signing key and scope with the listener's sasl.oauthbearer settings, and its subject (sub) with the relay's ACLs"}
	case source:
		return &AuthError{Field: fieldName, Err: err,
			Reason: "the relay has no SASL OAUTHBEARER token to send: see the error for the file or command that failed"}
	}
	return nil
}
