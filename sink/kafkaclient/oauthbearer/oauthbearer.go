// Package oauthbearer supplies SASL/OAUTHBEARER tokens (RFC 7628) to a franz-go
// Kafka client, from a file that is re-read or from a command whose standard output
// is the token.
//
// Invariants:
//   - A token is never sent past its expiry as far as this package can tell: a JWT's
//     exp claim is read (without verifying the signature: the broker does that) and a
//     token already expired is refused here, with an error naming the file or the
//     command, rather than sent to be refused by the broker.
//   - A file is read again for every new connection (and every re-authentication the
//     broker asks for, KIP-368): whatever rotates it (a Kubernetes projected
//     service-account token, an agent's sidecar) is followed without a restart.
//   - A command runs again only when the token it last printed is within Margin of
//     its expiry (or has none this package can read): commands may be slow or
//     rate-limited (a call to an identity provider), files are cheap.
//
// A Source is safe for concurrent use: franz-go authenticates its connections to
// several brokers at once; a command runs once for all of them.
package oauthbearer

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
)

// Defaults of Config.
const (
	DefaultMargin  = time.Minute
	DefaultTimeout = 30 * time.Second
)

// ErrExpired is wrapped by the error of a token whose exp has passed.
var ErrExpired = errors.New("token expired")

// ErrRefused is wrapped by the error of a token the broker did not accept (its
// RFC 7628 error response, whose status and scope the error quotes).
var ErrRefused = errors.New("the broker refused the OAUTHBEARER token")

// Config says where the token comes from. Exactly one of File and Command is set.
type Config struct {
	// File holds the token (surrounding white space is ignored). It is read for
	// every new connection.
	File string
	// Command is run with /bin/sh -c; its standard output, trimmed, is the token.
	// It runs again when its last token is within Margin of expiry.
	Command string
	// Margin: a command's token is replaced this long before its exp (default
	// DefaultMargin).
	Margin time.Duration
	// Timeout bounds one run of Command (default DefaultTimeout).
	Timeout time.Duration
	// Extensions are sent with the token (SASL extensions, KIP-342), such as
	// Confluent Cloud's logicalCluster and identityPoolId.
	Extensions map[string]string
}

// Source reads tokens as Config says. Use Mechanism with franz-go's kgo.SASL.
type Source struct {
	cfg Config
	now func() time.Time

	mu     sync.Mutex
	token  string    // the command's last token
	expiry time.Time // its exp; zero when it has none
}

// New checks cfg and fills its defaults. It reads nothing yet: the first
// connection does.
func New(cfg Config) (*Source, error) {
	cfg.File = strings.TrimSpace(cfg.File)
	cfg.Command = strings.TrimSpace(cfg.Command)
	switch {
	case cfg.File == "" && cfg.Command == "":
		return nil, errors.New("oauthbearer: no token source: name the file that holds the token or a command that prints it")
	case cfg.File != "" && cfg.Command != "":
		return nil, errors.New("oauthbearer: both a token file and a token command are set: keep one")
	case cfg.Margin < 0:
		return nil, fmt.Errorf("oauthbearer: margin %s is negative: use 0 or more (default %s)", cfg.Margin, DefaultMargin)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("oauthbearer: command timeout %s is negative: use 0 for the default (%s)", cfg.Timeout, DefaultTimeout)
	}
	if cfg.Margin == 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Source{cfg: cfg, now: time.Now}, nil
}

// Mechanism is the SASL mechanism for kgo.SASL: each authentication asks Token.
// A broker's refusal is an error wrapping ErrRefused with the broker's reason.
func (s *Source) Mechanism() sasl.Mechanism {
	return mechanism{oauth.Oauth(func(ctx context.Context) (oauth.Auth, error) {
		token, err := s.Token(ctx)
		if err != nil {
			return oauth.Auth{}, err
		}
		return oauth.Auth{Token: token, Extensions: s.cfg.Extensions}, nil
	})}
}

// mechanism is franz-go's OAUTHBEARER with the broker's refusal made readable:
// franz-go reports any server challenge as "unexpected data in oauth response",
// but a challenge is how a broker says why it refused the token (RFC 7628 section
// 3.2.2: a JSON object with a status such as invalid_token).
type mechanism struct{ sasl.Mechanism }

func (m mechanism) Authenticate(ctx context.Context, host string) (sasl.Session, []byte, error) {
	sess, first, err := m.Mechanism.Authenticate(ctx, host)
	if err != nil {
		return nil, nil, err
	}
	return session{sess, host}, first, nil
}

type session struct {
	sasl.Session
	host string
}

func (s session) Challenge(resp []byte) (bool, []byte, error) {
	done, next, err := s.Session.Challenge(resp)
	if err == nil || len(resp) == 0 {
		return done, next, err
	}
	var refusal struct {
		Status string `json:"status"`
		Scope  string `json:"scope"`
	}
	reason := strings.TrimSpace(string(resp))
	if json.Unmarshal(resp, &refusal) == nil && refusal.Status != "" {
		reason = "status " + refusal.Status
		if refusal.Scope != "" {
			reason += ", scope " + refusal.Scope
		}
	}
	return false, nil, fmt.Errorf("oauthbearer: %w (broker %s, %s): the token is not one the broker's OAuth settings accept; "+
		"compare its issuer (iss), audience (aud), signing key and scope with the broker's listener settings "+
		"(sasl.oauthbearer.* and its JAAS options), and its principal claim (sub) with the ACLs", ErrRefused, s.host, reason)
}

// Token returns a token that has not expired: the file's content now, or the
// command's last output while it is further than Margin from its expiry.
func (s *Source) Token(ctx context.Context) (string, error) {
	if s.cfg.File != "" {
		return s.fromFile()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.token != "" && !s.expiry.IsZero() && s.now().Add(s.cfg.Margin).Before(s.expiry) {
		return s.token, nil
	}
	token, expiry, err := s.fromCommand(ctx)
	if err != nil {
		return "", err
	}
	s.token, s.expiry = token, expiry
	return token, nil
}

func (s *Source) fromFile() (string, error) {
	b, err := os.ReadFile(s.cfg.File)
	if err != nil {
		return "", fmt.Errorf("oauthbearer: read the token file: %w: the file must exist and be readable by the relay's user "+
			"(for a Kubernetes projected service-account token, check the volume's mountPath and the path)", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("oauthbearer: the token file %s is empty: whatever writes it (an identity agent, a projected volume) has not written a token yet", s.cfg.File)
	}
	if _, err := s.check(token); err != nil {
		return "", fmt.Errorf("oauthbearer: the token in %s: %w", s.cfg.File, err)
	}
	return token, nil
}

func (s *Source) fromCommand(ctx context.Context) (string, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", s.cfg.Command)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A child the shell started (sleep, curl) may hold the output open after the
	// shell is killed at the timeout: stop waiting for it soon after.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return "", time.Time{}, fmt.Errorf("oauthbearer: the token command %q did not finish within %s: make it print the token sooner, or raise its timeout", s.cfg.Command, s.cfg.Timeout)
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("oauthbearer: the token command %q failed: %w%s: run it by hand as the relay's user to see why", s.cfg.Command, err, stderrTail(stderr.Bytes()))
	}
	token := strings.TrimSpace(stdout.String())
	if token == "" {
		return "", time.Time{}, fmt.Errorf("oauthbearer: the token command %q printed nothing on its standard output%s: it must print the token (and nothing else) there", s.cfg.Command, stderrTail(stderr.Bytes()))
	}
	if strings.ContainsAny(token, " \t\r\n") {
		return "", time.Time{}, fmt.Errorf("oauthbearer: the token command %q printed more than a token (white space inside its output): it must print the token alone, messages go to standard error", s.cfg.Command)
	}
	expiry, err := s.check(token)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("oauthbearer: the token the command %q printed: %w", s.cfg.Command, err)
	}
	return token, expiry, nil
}

// check reads token's expiry (zero when it has none this package can read) and
// refuses a token whose exp has passed.
func (s *Source) check(token string) (time.Time, error) {
	expiry, err := Expiry(token)
	if err != nil {
		return time.Time{}, err
	}
	if !expiry.IsZero() && !s.now().Before(expiry) {
		return time.Time{}, fmt.Errorf("%w at %s (now %s): the identity provider must issue a fresh one; "+
			"a file must be rewritten before its token expires", ErrExpired,
			expiry.UTC().Format(time.RFC3339), s.now().UTC().Format(time.RFC3339))
	}
	return expiry, nil
}

// Expiry returns the exp claim of a JWT (RFC 7519) without verifying its signature,
// or the zero time when token is not a JWT (an opaque token: OAUTHBEARER allows
// them) or has no exp. A JWT whose exp is not a number is an error.
func Expiry(token string) (time.Time, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, nil
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, nil // not base64url: not a JWT, an opaque token with dots
	}
	var claims map[string]json.RawMessage
	if err := json.Unmarshal(payload, &claims); err != nil {
		return time.Time{}, nil // not a JSON object: not a JWT either
	}
	raw, ok := claims["exp"]
	if !ok {
		return time.Time{}, nil
	}
	var exp json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&exp); err != nil {
		return time.Time{}, fmt.Errorf("the JWT's exp claim is %s, not a number of seconds since 1970 (RFC 7519): the identity provider issued a malformed token", raw)
	}
	secs, err := exp.Float64()
	if err != nil || secs <= 0 {
		return time.Time{}, fmt.Errorf("the JWT's exp claim is %s, not a positive number of seconds since 1970 (RFC 7519): the identity provider issued a malformed token", raw)
	}
	whole := int64(secs)
	return time.Unix(whole, int64((secs-float64(whole))*float64(time.Second))), nil
}

// stderrTail is the last line of a command's standard error, for its error.
func stderrTail(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	last := strings.TrimSpace(lines[len(lines)-1])
	if last == "" {
		return ""
	}
	if len(last) > 200 {
		last = last[:200] + "…"
	}
	return fmt.Sprintf(" (its standard error: %q)", last)
}
